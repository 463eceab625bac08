"""Stopping from outside: POST /api/grids/{id}/stop and `ablate stop` (runs or a grid), against the app served
for real on loopback and a real migrated database. Graceful as POST /api/runs/{id}/stop: a queued run stops
at once, a running one is flagged for the launcher (which stops it at its next step, keeping a checkpoint)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchestrator.app import create_app
from orchestrator.db.models import Event, Run
from orchestrator.db.session import session_scope
from orchestrator.settings import Settings
from tests.kit.net import served

TOKEN = "stop-test-token-0123456789"  # as long as ABLATE_API_TOKEN must be, for the CLI
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def base(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    settings = Settings(database_url=database_url, home_dir=tmp_path_factory.mktemp("home"))
    with served(create_app(settings, TOKEN)) as url:
        yield url


def grid_in_every_state(base: str, database_url: str) -> tuple[int, list[int]]:
    """A grid of four runs: queued, running, running with a stop asked already, completed."""
    resp = httpx.post(f"{base}/api/grids", json={"name": "wrong grid", "arms": ["A", "B", "C", "D"]}, headers=AUTH)
    assert resp.status_code == 201, resp.text
    grid_id = resp.json()["id"]
    ids = [r["id"] for r in httpx.get(f"{base}/api/grids/{grid_id}").json()["runs"]]
    with session_scope(database_url) as s:
        s.get_one(Run, ids[1]).state = "running"
        s.get_one(Run, ids[2]).state, s.get_one(Run, ids[2]).stop_requested = "running", True
        s.get_one(Run, ids[3]).state = "completed"
    return grid_id, ids


def ablate(*args: str, home: Path, token: str = TOKEN) -> subprocess.CompletedProcess[str]:
    """The `ablate` command as a user runs it, with the server's token (ABLATE_API_TOKEN) unless told."""
    exe = shutil.which("ablate")
    cmd = [exe, *args] if exe else [sys.executable, "-c", "from orchestrator.cli import main; main()", *args]
    env = {**os.environ, "ABLATE_API_TOKEN": token, "ABLATE_HOME_DIR": str(home), "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(cmd, env=env, cwd=home, capture_output=True, text=True, timeout=120)


def test_a_grid_stops_with_one_request_and_again_changes_nothing(base: str, database_url: str) -> None:
    grid_id, ids = grid_in_every_state(base, database_url)
    assert httpx.post(f"{base}/api/grids/{grid_id}/stop").status_code == 401
    assert httpx.post(f"{base}/api/grids/{grid_id}/stop", headers={"Authorization": "Bearer wrong"}).status_code == 401

    first = httpx.post(f"{base}/api/grids/{grid_id}/stop", headers=AUTH)
    assert first.status_code == 200, first.text
    assert first.json()["grid_id"] == grid_id
    assert [(r["run_id"], r["state"], r["outcome"]) for r in first.json()["runs"]] == [
        (ids[0], "stopped", "stopped"),  # queued: at once
        (ids[1], "running", "stop_requested"),  # running: the launcher stops it at its next checkpoint
        (ids[2], "running", "already_stopping"),
        (ids[3], "completed", "already_ended"),
    ]
    with session_scope(database_url) as s:
        runs = [s.get_one(Run, i) for i in ids]
        assert [(r.state, r.stop_requested, r.decision) for r in runs] == [
            ("stopped", False, "user"), ("running", True, None), ("running", True, None), ("completed", False, None)]
        kinds = {i: [e.kind for e in s.query(Event).filter(Event.run_id == i)] for i in ids}
    assert (kinds[ids[0]][-1], kinds[ids[1]][-1]) == ("stopped", "stop_requested")
    assert "stop_requested" not in kinds[ids[2]] and "stop_requested" not in kinds[ids[3]]  # nothing asked twice

    again = httpx.post(f"{base}/api/grids/{grid_id}/stop", headers=AUTH)
    assert again.status_code == 200
    assert [r["outcome"] for r in again.json()["runs"]] == ["already_ended", "already_stopping", "already_stopping",
                                                           "already_ended"]  # fmt: skip
    assert again.json()["runs"][0]["message"] == "already stopped: nothing to stop"
    with session_scope(database_url) as s:
        assert s.query(Event).filter(Event.run_id == ids[1], Event.kind == "stop_requested").count() == 1


def test_an_unknown_grid_is_a_404_naming_it(base: str) -> None:
    for grid_id in (987654, 0, 2**40):
        resp = httpx.post(f"{base}/api/grids/{grid_id}/stop", headers=AUTH)
        assert (resp.status_code, resp.json()) == (404, {"detail": f"no grid with id {grid_id}"})


def test_ablate_stop_grid_says_what_happened_to_each_run(base: str, database_url: str, tmp_path: Path) -> None:
    grid_id, ids = grid_in_every_state(base, database_url)
    proc = ablate("stop", "--grid", str(grid_id), "--url", base, home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"run {ids[0]} (A s0): stopped before it started",
        f"run {ids[1]} (B s0): stop requested: it stops at its next step, keeping a checkpoint",
        f"run {ids[2]} (C s0): already being stopped: it stops at its next step, keeping a checkpoint",
        f"run {ids[3]} (D s0): already completed: nothing to stop",
    ]
    again = ablate("stop", "--grid", str(grid_id), "--url", base, home=tmp_path)
    assert again.returncode == 0 and f"run {ids[0]} (A s0): already stopped: nothing to stop" in again.stdout


def test_ablate_stop_runs_stops_each_and_names_an_unknown_id_in_one_line(
    base: str, database_url: str, tmp_path: Path
) -> None:
    _, ids = grid_in_every_state(base, database_url)
    proc = ablate("stop", str(ids[0]), "987654", *(str(i) for i in ids[1:]), "--url", base, home=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout.splitlines() == [
        f"run {ids[0]} (A s0): stopped before it started",
        f"run {ids[1]} (B s0): stop requested: it stops at its next step, keeping a checkpoint",
        f"run {ids[2]} (C s0): already being stopped: it stops at its next step, keeping a checkpoint",
        f"run {ids[3]} (D s0): already completed: nothing to stop",
    ]
    assert proc.stderr.strip() == f"error: no run with id 987654 on {base}"  # the others were stopped all the same
    with session_scope(database_url) as s:
        assert (s.get_one(Run, ids[0]).state, s.get_one(Run, ids[1]).stop_requested) == ("stopped", True)
        assert s.query(Event).filter(Event.run_id == ids[2], Event.kind == "stop_requested").count() == 0


def test_ablate_stop_without_a_server_a_token_or_a_target_is_one_line(
    base: str, database_url: str, tmp_path: Path
) -> None:
    assert ablate("stop", "--grid", "987654", "--url", base, home=tmp_path).stderr.strip() == (
        f"error: no grid with id 987654 on {base}")
    nothing = ablate("stop", "--url", base, home=tmp_path)
    assert nothing.returncode == 2 and nothing.stderr.startswith("error: stop what?")
    dead = ablate("stop", "1", "--url", "http://127.0.0.1:9", home=tmp_path)
    assert (dead.returncode, dead.stderr.strip()) == (
        2, "error: no ablate server reachable at http://127.0.0.1:9: start one with `ablate serve`, or point "
           "ABLATE_URL (or --url) at one")
    grid_id, ids = grid_in_every_state(base, database_url)
    rejected = f"error: {base} rejected the API token: use the server's (ABLATE_API_TOKEN or {tmp_path}/api_token)"
    for target in ([str(ids[1])], ["--grid", str(grid_id)]):
        wrong = ablate("stop", *target, "--url", base, home=tmp_path, token="a-wrong-token-of-some-length")
        assert (wrong.returncode, wrong.stderr.strip()) == (2, rejected)
    with session_scope(database_url) as s:
        assert [(s.get_one(Run, i).state, s.get_one(Run, i).stop_requested) for i in ids[:2]] == [
            ("queued", False), ("running", False)]  # nothing was stopped
