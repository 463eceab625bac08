"""Install without an index: bootstrap's default install path into a fresh venv on a test-bed node,
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

from orchestrator.fleet.bootstrap import BootstrapConfig, bootstrap_node
from tests.cluster.conftest import ROOT, node_config, register_node
from tests.cluster.testbed import TestBed


def test_default_install_from_a_wheelhouse_with_no_index(
    database_url: str, testbed: TestBed, tmp_path: Path
) -> None:
    wheelhouse = tmp_path / "wheelhouse"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheelhouse), "."],
        cwd=ROOT,
        check=True,
        timeout=300,
    )
    [wheel] = wheelhouse.glob("ablate-*.whl")
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
    installed = list((venv / "lib").glob("python3*/site-packages/ablate-*.dist-info"))
    assert len(installed) == 1
    assert "start-head" in (node.home / "ablate" / "helper.txt").read_text()  # ran from the fresh venv
