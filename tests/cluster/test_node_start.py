"""A node's own Ray and its agent, on a firewalled test-bed node over real SSH: bootstrap starts the node's
Ray head with a token made on the node (the controller holds none), the controller's agent link says hello
over the node's SSH connection, drain ends exactly the node's Ray session, and the node's firewall leaves
the controller unreachable from it."""

from __future__ import annotations

import stat
import sys

from sqlalchemy import select

from orchestrator.db.models import Event
from orchestrator.db.session import session_scope
from orchestrator.fleet.agent_link import ChannelStream, open_link
from orchestrator.fleet.bootstrap import bootstrap_node, drain_node
from orchestrator.fleet.inventory import get_node
from orchestrator.fleet.node_pool import remote_agent_command
from orchestrator.fleet.shell import NodeShell
from orchestrator.settings import Settings
from tests.cluster.testbed import TestBed
from tests.kit.bed import node_config, register_node
from worker.node_ray import session_pids


def _row(database_url: str, name: str):  # noqa: ANN202
    with session_scope(database_url) as session:
        node = get_node(session, name)
        session.expunge(node)
    return node


def test_a_node_runs_its_own_ray_with_a_token_made_there_and_drain_ends_only_that(
    database_url: str, testbed: TestBed, tmp_path
) -> None:
    name = register_node(database_url, testbed.nodes[0])
    node = testbed.nodes[0]
    config = node_config(testbed)
    bootstrap_node(database_url, name, config)

    ray_dir = node.home / "ablate" / "ray"
    token = ray_dir / "token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and token.stat().st_uid == node.uid
    assert stat.S_IMODE(ray_dir.stat().st_mode) == 0o700
    assert (ray_dir / "address").read_text().startswith("127.0.0.1:")  # the head listens on the node's loopback
    with session_scope(database_url) as session:
        node_id = get_node(session, name).id
        events = list(session.scalars(select(Event).where(Event.node_id == node_id)))
    assert not any(token.read_text() in (e.message + str(e.data)) for e in events)  # never left the node
    assert not any("ray_token" in e.message for e in events)  # nothing of the controller's was copied there
    sid = int((ray_dir / "session").read_text())
    assert session_pids(sid)

    settings = Settings(database_url=database_url, home_dir=tmp_path, ray_namespace="ablate-start-test")
    command = remote_agent_command(settings, config.remote_dir)
    link, hello = open_link(name, lambda: ChannelStream(NodeShell.open(_row(database_url, name)).client, command))
    try:
        assert (hello.gpus, hello.workers) == (2, [])  # the node's own Ray, with its two declared GPUs
    finally:
        link.close()

    drain_node(database_url, name, config)
    assert session_pids(sid) == []
    with session_scope(database_url) as session:
        assert get_node(session, name).state == "drained"


SCAN = """
import socket, sys
host, refused, other = sys.argv[1], 0, []
ports = [*range(1, 1025), 2379, 5432, 6379, 6380, 8000, 8080, 8265, 10001, *range(10002, 10102), int(sys.argv[2])]
for port in ports:
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((host, port))
        other.append(f"{port} open")
    except ConnectionRefusedError:
        refused += 1
    except OSError as exc:
        other.append(f"{port} {exc}")
    finally:
        s.close()
print(refused, len(ports), other)
"""


def test_from_inside_a_node_every_port_of_the_controller_refuses(testbed: TestBed) -> None:
    """The bed's provider NAT: a connect scan of the controller's address from a node finds nothing open
    (the API, Postgres, any Ray port), though the controller listens on its side of the bridge."""
    import socket

    listening = socket.socket()
    listening.bind((testbed.controller_ip, 0))
    listening.listen()
    port = listening.getsockname()[1]
    try:
        node = testbed.nodes[1]
        result = testbed.in_node(node, sys.executable, "-c", SCAN, testbed.controller_ip, str(port), timeout=300)
        refused, scanned, other = result.stdout.split(" ", 2)
        assert other.strip() == "[]", other  # nothing open, nothing merely timing out
        assert int(refused) == int(scanned) == 1024 + 8 + 100 + 1
        # The controller still reaches the node's SSH.
        socket.create_connection((testbed.nodes[1].ip, 22), timeout=5).close()
    finally:
        listening.close()
