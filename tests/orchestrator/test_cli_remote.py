"""One way in (issue 64): every read command asks the controller's REST API (ABLATE_URL and its token), from
any folder, and leaves no database behind; an evaluation says why it waits and can be cancelled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fastapi.testclient import TestClient

from orchestrator.db.models import Evaluation, EvaluationResult
from orchestrator.db.session import session_scope, upgrade
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.vocabulary import EvaluationState
from tests.kit.net import controller_env
from tests.kit.settings import AUTH


def cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`ablate ARGS` with only `env` of ablate's variables set (none from this machine's)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("ABLATE_")}
    cmd = [sys.executable, "-c", "from orchestrator.cli import main; main()", *args]
    return subprocess.run(cmd, env={**base, **env, "COLUMNS": "200", "PYTHONPATH": os.getcwd()}, cwd=cwd,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_reads_from_an_empty_folder_go_through_the_controller(database_url: str, tmp_path: Path) -> None:
    upgrade(database_url)
    with session_scope(database_url) as session:
        grid_id = create_grid(session, GridCreate(name="served-grid", arms=["A", "B"])).id
    folder = tmp_path / "empty"
    folder.mkdir()
    with controller_env(database_url, tmp_path / "controller") as env:
        listed = cli("status", "--json", env=env, cwd=folder)
        assert listed.returncode == 0, listed.stderr
        assert grid_id in [g["id"] for g in json.loads(listed.stdout)]
        events = cli("events", "--grid", str(grid_id), "--json", env=env, cwd=folder)
        assert events.returncode == 0, events.stderr
        assert [e["kind"] for e in json.loads(events.stdout)] == ["grid.created"]
        report = cli("report", str(grid_id), env=env, cwd=folder)
        assert report.returncode == 0, report.stderr
        assert "served-grid" in (folder / ".ablate" / "reports" / f"grid-{grid_id}" / "report.md").read_text()
        decision = cli("status", str(grid_id), "--json", env=env, cwd=folder)
        assert json.loads(decision.stdout)["grid"]["name"] == "served-grid"
    databases = [p for p in folder.rglob("*") if p.suffix == ".db" or "sqlite" in p.name]
    assert databases == [], databases


def test_no_controller_is_one_line_that_says_how_and_creates_nothing(tmp_path: Path) -> None:
    (tmp_path / ".ablate").mkdir()
    (tmp_path / ".ablate" / "demo.db").write_bytes(b"")  # what `ablate demo` leaves
    env = {"ABLATE_URL": "http://127.0.0.1:9"}
    for args in (["status"], ["events"], ["report", "1"], ["nodes", "list"]):
        proc = cli(*args, env={**env, "ABLATE_API_TOKEN": "t" * 16}, cwd=tmp_path)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, (args, proc.stderr)
        assert "`ablate serve`" in lines[0] and "ABLATE_URL" in lines[0] and "ablate demo --hold" in lines[0]
    assert sorted(p.name for p in tmp_path.rglob("*")) == [".ablate", "demo.db"]


def test_plan_with_every_hour_given_prints_no_database_complaint(tmp_path: Path) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text("name: p\narms: [A, B]\ngpus_per_arm: auto\n")
    proc = cli("plan", str(grid), "--gpus", "2", "--hours", "A=2,B=3", env={}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "database" not in proc.stderr and "rates" not in proc.stderr, proc.stderr
    assert not (tmp_path / ".ablate").exists()


def test_an_evaluation_says_why_it_waits_and_can_be_cancelled(client: TestClient, settings: object) -> None:
    from orchestrator.runs.evaluation_jobs import NO_GPUS

    database_url = settings.database_url  # type: ignore[attr-defined]
    with session_scope(database_url) as session:
        grid = create_grid(session, GridCreate(name="to-evaluate", arms=["A"]))
        evaluation = Evaluation(grid_id=grid.id, images=4, step="final", state=EvaluationState.queued)
        session.add(evaluation)
        session.flush()
        session.add(EvaluationResult(evaluation_id=evaluation.id, run_id=grid.runs[0].id, step=10,
                                     state=EvaluationState.queued, error=f"waiting: {NO_GPUS}"))  # fmt: skip
        grid_id, eid = grid.id, evaluation.id
    shown = client.get(f"/api/grids/{grid_id}/evaluations/{eid}").json()
    assert shown["waiting"] == f"waiting: {NO_GPUS}"
    assert client.delete(f"/api/grids/{grid_id}/evaluations/{eid}").status_code == 401
    cancelled = client.delete(f"/api/grids/{grid_id}/evaluations/{eid}", headers=AUTH)
    assert cancelled.status_code == 200, cancelled.text
    assert (cancelled.json()["state"], cancelled.json()["error"]) == ("failed", "cancelled by the user")
    assert [r["state"] for r in cancelled.json()["runs"]] == ["failed"]
    again = client.delete(f"/api/grids/{grid_id}/evaluations/{eid}", headers=AUTH)
    assert again.status_code == 409 and "failed already" in again.json()["detail"]


def test_the_decision_route_answers_a_grid_that_does_not_decide(client: TestClient, settings: object) -> None:
    with session_scope(settings.database_url) as session:  # type: ignore[attr-defined]
        grid_id = create_grid(session, GridCreate(name="fixed", arms=["A", "B"])).id
    answer = client.get(f"/api/grids/{grid_id}/decision").json()
    assert (answer["state"], answer["comparisons"], answer["spent_gpu_hours"]) == (None, [], 0.0)
    assert client.get("/api/grids/424242/decision").status_code == 404
