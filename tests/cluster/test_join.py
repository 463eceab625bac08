"""Real join and leave: `ray start` on a namespace node into the controller's token-auth Ray head."""

from __future__ import annotations

import stat

import pytest
from sqlalchemy import select

from orchestrator.db.models import Event
from orchestrator.db.session import session_scope
from orchestrator.fleet.bootstrap import bootstrap_node, drain_node
from orchestrator.fleet.inventory import get_node
from orchestrator.fleet.ray_cluster import RayHead, session_pids
from orchestrator.fleet.shell import CommandFailed, NodeShell
from tests.cluster.conftest import alive_nodes, node_config, register_node
from tests.cluster.testbed import TestBed


def test_node_joins_with_the_token_and_leaves_only_its_own_session(
    database_url: str, testbed: TestBed, ray_head: RayHead
) -> None:
    name = register_node(database_url, testbed.nodes[0])
    node = testbed.nodes[0]
    config = node_config(testbed, ray_head)
    bootstrap_node(database_url, name, config)

    assert alive_nodes(ray_head).get(node.ip) == 2.0  # joined, with its two declared GPUs
    token = node.home / "ablate" / "ray_token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert token.read_text() == ray_head.token_file.read_text()
    with session_scope(database_url) as session:
        node_id = get_node(session, name).id
        commands = list(session.scalars(select(Event.message).where(Event.node_id == node_id)))
    assert any("ray start" in c for c in commands)
    assert not any(ray_head.token_file.read_text() in c for c in commands)  # never on a command line
    sid = int((node.home / "ablate" / "ray" / "session").read_text())
    assert session_pids(sid)  # the node's raylet and friends live in the recorded session

    drain_node(database_url, name, config)
    assert session_pids(sid) == []
    nodes = alive_nodes(ray_head)  # the head (and the test's Ray) lives on
    assert ray_head.address.split(":")[0] in nodes
    with session_scope(database_url) as session:
        assert get_node(session, name).state == "drained"


def test_node_without_the_token_is_refused(database_url: str, testbed: TestBed, ray_head: RayHead) -> None:
    name = register_node(database_url, testbed.nodes[1])
    node = testbed.nodes[1]
    # The default join, minus the token: RAY_AUTH_MODE/RAY_AUTH_TOKEN_PATH left out.
    join = node_config(testbed, ray_head).join[0].replace("RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={token_path}", "")
    config = node_config(testbed, ray_head, join=[join])
    with pytest.raises(CommandFailed, match="Authentication token is missing or incorrect"):
        bootstrap_node(database_url, name, config)
    assert node.ip not in alive_nodes(ray_head)
    with NodeShell.open(_row(database_url, name)) as shell:  # leave what the failed start left behind
        shell.run(config.leave[0].format(**config.variables(0)))


def _row(database_url: str, name: str):  # noqa: ANN202
    with session_scope(database_url) as session:
        node = get_node(session, name)
        session.expunge(node)
    return node
