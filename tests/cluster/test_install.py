"""Install without an index, and no install where the node already has this version.

Install without an index: bootstrap's default install path into a fresh venv on a test-bed node,
from a wheelhouse built in the test and copied over SFTP.

What this proves: the install steps (`python -m venv`, `pip install --no-index --find-links
<wheelhouse>`) run on a node that cannot reach any index (the namespace's only network is the
bridge), the project's wheel lands in the new venv, and the node agent that the start and leave commands
use runs from it. What it does not: the full dependency closure (torch,
ray, ... are gigabytes), so the package line adds `--no-deps`; the other cluster tests use a
pre-built environment, as the worker image does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from orchestrator.db.models import Event, Node
from orchestrator.db.session import session_scope
from orchestrator.fleet.bootstrap import BootstrapConfig, bootstrap_node
from orchestrator.fleet.shell import CommandFailed
from orchestrator.vocabulary import NodeState
from tests.cluster.testbed import TestBed
from tests.kit.bed import ROOT, node_config, register_node


def test_default_install_from_a_wheelhouse_with_no_index(database_url: str, testbed: TestBed, tmp_path: Path) -> None:
    wheelhouse = tmp_path / "wheelhouse"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheelhouse), "."],
        cwd=ROOT,
        check=True,
        timeout=300,
    )
    [wheel] = wheelhouse.glob("ablate_dit-*.whl")
    node = testbed.nodes[0]
    probe = "import socket; socket.create_connection(('pypi.org', 443), 3)"
    unreachable = testbed.in_node(node, sys.executable, "-c", probe)
    assert unreachable.returncode != 0  # the node has no way to an index

    default = BootstrapConfig()
    config = node_config(
        testbed,
        venv=None,  # the default: {remote_dir}/venv, made by the install
        python=sys.executable,  # its venv module makes a fresh venv on the base interpreter
        package=wheel,
        wheelhouse=wheelhouse,
        install=[*default.install[:2], default.install[2] + " --no-deps"],
        start=["{venv}/bin/python -m worker.agent --help > {remote_dir}/helper.txt"],
    )
    bootstrap_node(database_url, register_node(database_url, node, name="fresh"), config)

    venv = node.home / "ablate" / "venv"
    assert (node.home / "ablate" / "wheelhouse" / wheel.name).is_file()  # copied over SFTP
    installed = list((venv / "lib").glob("python3*/site-packages/ablate_dit-*.dist-info"))
    assert len(installed) == 1
    assert "start-head" in (node.home / "ablate" / "helper.txt").read_text()  # ran from the fresh venv


def test_an_environment_holding_this_version_skips_the_install_and_an_older_one_does_not(
    database_url: str, testbed: TestBed, tmp_path: Path
) -> None:
    """What bootstrap does on a node started from the worker image, told by the version the environment's
    own Python reports: an install that would fail (`false`) is never run where the version matches."""
    node = testbed.nodes[1]
    ready = register_node(database_url, node, name="ready")
    bootstrap_node(database_url, ready, node_config(testbed, install=["false"]))  # the pre-built environment
    stale = node.home / "stale-venv"
    (stale / "bin").mkdir(parents=True)
    (stale / "bin" / "python").write_text("#!/bin/sh\necho 0.0.1\n")  # an image built from an older ablate
    (stale / "bin" / "python").chmod(0o755)
    with pytest.raises(CommandFailed):
        bootstrap_node(
            database_url,
            register_node(database_url, node, name="stale"),
            node_config(testbed, venv=str(stale), install=["false"]),
        )
    with session_scope(database_url) as session:
        query = select(Node.name, Event.data).join(Node, Event.node_id == Node.id)
        skipped = session.execute(query.where(Event.kind == "node.install_skipped")).all()
        assert [(name, data["venv"]) for name, data in skipped] == [("ready", sys.prefix)]
        stale_row = session.scalars(select(Node).where(Node.name == "stale")).one()
        assert (stale_row.state, stale_row.state_detail) == (NodeState.bootstrap_failed, "install: exit 1")
