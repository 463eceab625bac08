"""What an operator reads about nodes, against a real OpenSSH server on loopback and a real database: the
events of a node and of a run (`ablate events`, GET /api/events), the last probe after a bootstrap, why a
connect was refused, and a run's node by its registered name."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from orchestrator.app import create_app
from orchestrator.db.models import Event, Run
from orchestrator.db.session import session_scope
from orchestrator.fleet.bootstrap import BootstrapConfig, bootstrap_node
from orchestrator.fleet.inventory import NodeCreate, add_node, get_node
from orchestrator.fleet.probe import probe_node
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.results.views import RunSummary
from orchestrator.runs.placement import claim_for_launch, mark_running
from orchestrator.settings import Settings
from tests.kit.net import controller_for, free_port
from tests.kit.nodes import add_ssh_node
from tests.kit.settings import tiny_overrides

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def ablate(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A read asks a controller served on `database_url` (tests/kit/net.py controller_for)."""
    env = {**os.environ, "ABLATE_DATABASE_URL": database_url, "COLUMNS": "250", "PYTHONPATH": os.getcwd()}
    with tempfile.TemporaryDirectory() as home, controller_for(args, env, Path(home)) as controller:
        return subprocess.run([sys.executable, "-c", "from orchestrator.cli import main; main()", *args],
                              env={**env, **controller}, capture_output=True, text=True, timeout=120)  # fmt: skip


def test_a_node_s_events_and_a_run_s_are_listed_by_rest_and_cli(database_url: str, sshd, tmp_path: Path) -> None:  # noqa: ANN001
    name = add_ssh_node(database_url, sshd, "events-a")
    probe_node(database_url, name)
    with session_scope(database_url) as session:
        grid = create_grid(session, GridCreate(name="events", arms=["A"], overrides=tiny_overrides(steps=4)))
        run = grid.runs[0]
        assert claim_for_launch(session, run, str(tmp_path / "run"))
        mark_running(session, run, {"node": "a-hostname-shared-by-clones"}, name)
        run_id, grid_id = run.id, grid.id
    with session_scope(database_url) as session:  # the grid listing names the node as it is registered
        summary = RunSummary.from_row(session.get_one(Run, run_id), None)
        assert summary.node == name
        started = session.scalars(select(Event).where(Event.run_id == run_id, Event.kind == "started")).one()
        assert started.data["node"] == "a-hostname-shared-by-clones" and started.data["node_name"] == name

    with TestClient(create_app(Settings(database_url=database_url, home_dir=tmp_path), TOKEN)) as client:
        assert client.get("/api/events").status_code == 401  # a node's commands are infrastructure
        listed = client.get("/api/events", params={"node": name}, headers=AUTH)
        assert listed.status_code == 200, listed.text
        kinds = [e["kind"] for e in listed.json()]
        assert "node.command" in kinds and "started" in kinds, kinds
        ids = [e["id"] for e in listed.json()]
        assert ids == sorted(ids, reverse=True)  # newest first
        commands = client.get("/api/events", params={"node": name, "kind": "node."}, headers=AUTH).json()
        assert commands and all(e["kind"].startswith("node.") for e in commands)
        assert any("nvidia-smi" in e["message"] and e["data"]["exit_code"] == 0 for e in commands)
        by_run = client.get("/api/events", params={"run": run_id}, headers=AUTH).json()
        assert [e["kind"] for e in by_run] == ["started"] and by_run[0]["grid_id"] == grid_id
        page = client.get("/api/events", params={"node": name, "limit": 2, "before": ids[1]}, headers=AUTH).json()
        assert [e["id"] for e in page] == ids[2:4]
        missing = client.get("/api/events", params={"node": "no-such-node"}, headers=AUTH)
        assert missing.status_code == 404 and "ablate nodes list" in missing.json()["detail"]
        nul = client.get("/api/events", params={"kind": "\x00"}, headers=AUTH)  # Postgres refuses NUL in text
        assert nul.status_code == 422 and nul.json()["detail"][0]["loc"] == ["query", "kind"], nul.text
        past = client.get("/api/events", params={"before": 2**31}, headers=AUTH)  # past a 32-bit id: Postgres refuses
        assert past.status_code == 422 and past.json()["detail"][0]["loc"] == ["query", "before"], past.text

    shown = ablate(database_url, "events", "--node", name, "--kind", "node.")
    assert shown.returncode == 0, shown.stderr
    assert "node.command" in shown.stdout and "nvidia-smi" in shown.stdout and "started" not in shown.stdout
    shown = ablate(database_url, "events", "--run", str(run_id), "--full")
    assert shown.returncode == 0 and "started" in shown.stdout and "a-hostname-shared-by-clones" in shown.stdout
    listing = ablate(database_url, "nodes", "list")
    probed = [line for line in listing.stdout.splitlines() if name in line]
    assert probed and "20" in probed[0].rsplit("│", 2)[-2], listing.stdout  # the probe's time, not "-"


def test_a_refused_connect_says_why(database_url: str, sshd, tmp_path: Path) -> None:  # noqa: ANN001
    closed = free_port()  # nothing listens there
    body = NodeCreate(name="refusing", host="127.0.0.1", port=closed, user=sshd.user, key_path=str(sshd.client_key),
                      known_hosts_path=str(sshd.known_hosts), gpus=4)  # fmt: skip
    with session_scope(database_url) as session:
        add_node(session, body)
    with pytest.raises(Exception, match="Connection refused"):
        bootstrap_node(database_url, "refusing", BootstrapConfig(remote_dir="x"))
    with session_scope(database_url) as session:
        node = get_node(session, "refusing")
        assert node.state == "bootstrap_failed"
        detail = node.state_detail or ""
        assert detail.startswith("connect: ") and "Connection refused" in detail, detail
    listing = ablate(database_url, "nodes", "list")
    assert "Connection refused" in listing.stdout, listing.stdout
