"""More images without retraining: POST /api/grids/{id}/evaluations evaluates every run's stored checkpoint
again on N held-out images, as jobs the launcher places on a node of real Ray (4 logical GPUs), and the
report's effects use it. A 2-arm x 2-seed tiny grid trained on the CPU in this process, a migrated database."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from orchestrator.db.models import EvaluationResult, Metric, Run
from orchestrator.db.session import session_scope
from orchestrator.runs.launcher import Launcher
from orchestrator.settings import Settings
from tests.kit.launcher import launcher_settings_for
from tests.kit.net import served
from tests.kit.polling import wait_for
from tests.kit.settings import AUTH, tiny_overrides
from tests.kit.trained_runs import train_grid_runs
from worker.run_files import CKPT_GLOB

HELD_OUT, TRAINED_ON, STEPS = 16, 4, 20
CLI_TOKEN = "evaluations-test-token"  # the command's settings take a token of 16 characters or more


@pytest.fixture(scope="module")
def grid(client: TestClient, settings: Settings) -> int:
    overrides = tiny_overrides(STEPS)
    overrides["data"]["held_out"], overrides["eval"]["num_samples"] = HELD_OUT, TRAINED_ON
    body = {"name": "evaluated", "arms": ["A", "B"], "overrides": overrides, "seeds": 2}
    resp = client.post("/api/grids", json=body, headers=AUTH)
    assert resp.status_code == 201, resp.text
    grid_id = resp.json()["id"]
    train_grid_runs(settings, grid_id)
    return grid_id


@pytest.fixture(scope="module")
def base_url(settings: Settings) -> Iterator[str]:
    """The API served for real, for the `ablate` command."""
    from orchestrator.app import create_app

    with served(create_app(settings, CLI_TOKEN)) as url:
        yield url


def ablate_evaluate(base_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ABLATE_API_TOKEN": CLI_TOKEN, "COLUMNS": "200", "NO_COLOR": "1"}
    cmd = [sys.executable, "-m", "orchestrator.cli", "evaluate", *args, "--url", base_url]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def snapshot(database_url: str, grid_id: int) -> dict:
    """What training stored: every metric row's numbers, each run's steps, and its checkpoint files."""
    with session_scope(database_url) as session:
        runs = session.scalars(select(Run).where(Run.grid_id == grid_id)).all()
        rows = session.scalars(select(Metric).where(Metric.run_id.in_([r.id for r in runs]))).all()
        return {
            "metrics": sorted((m.run_id, m.step, m.val_flow_loss, m.val_flow_loss_n, str(m.extra)) for m in rows),
            "steps": {r.id: (r.last_checkpoint_step, r.best_step, r.state) for r in runs},
            "files": {r.id: sorted(p.name for p in Path(r.checkpoint_dir).glob(CKPT_GLOB)) for r in runs},
        }


def effect_ns(client: TestClient, grid_id: int) -> set[int]:
    report = client.get(f"/api/grids/{grid_id}/report.json").json()
    return {s["n"] for e in report["effects"] if e["metric"] == "val_flow_loss" for s in e["per_seed"]}


def wait_ended(client: TestClient, grid_id: int, eid: int) -> dict:
    def ended() -> dict | None:
        got = client.get(f"/api/grids/{grid_id}/evaluations/{eid}").json()
        return got if got["state"] in ("completed", "failed") else None

    return wait_for(ended, f"evaluation {eid} to end", timeout=240, interval=0.5)


def test_images_past_the_held_out_split_are_a_422_naming_images_and_the_splits_size(
    client: TestClient, grid: int
) -> None:
    resp = client.post(f"/api/grids/{grid}/evaluations", json={"images": HELD_OUT + 1}, headers=AUTH)
    assert resp.status_code == 422, resp.text
    (error,) = resp.json()["detail"]
    assert error["loc"] == ["body", "images"] and f"the held-out split has {HELD_OUT}" in error["msg"]


@pytest.mark.parametrize("step", [7, "last", -1])
def test_a_step_not_kept_by_every_run_is_a_422_naming_step(client: TestClient, grid: int, step: object) -> None:
    resp = client.post(f"/api/grids/{grid}/evaluations", json={"images": 8, "step": step}, headers=AUTH)
    assert resp.status_code == 422, resp.text
    assert all(e["loc"][:2] == ["body", "step"] for e in resp.json()["detail"]), resp.json()


def test_a_grid_with_runs_not_ended_is_a_422_naming_step(client: TestClient, settings: Settings) -> None:
    created = client.post("/api/grids", json={"name": "live", "arms": ["A"], "overrides": tiny_overrides(10)},
                          headers=AUTH).json()  # fmt: skip
    resp = client.post(f"/api/grids/{created['id']}/evaluations", json={"images": 2}, headers=AUTH)
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["body", "step"]
    assert "still queued or running" in resp.json()["detail"][0]["msg"]
    with session_scope(settings.database_url) as session:  # never launched by the test below
        for run in session.scalars(select(Run).where(Run.grid_id == created["id"])):
            run.state = "stopped"


def test_a_grid_or_evaluation_that_does_not_exist_is_a_404(client: TestClient, grid: int) -> None:
    assert client.post("/api/grids/999999/evaluations", json={"images": 2}, headers=AUTH).status_code == 404
    assert client.get(f"/api/grids/{grid}/evaluations/999999").status_code == 404


def test_the_command_says_what_is_wrong_in_one_line(base_url: str, grid: int) -> None:
    too_many = ablate_evaluate(base_url, str(grid), "--images", str(HELD_OUT + 1))
    assert too_many.returncode == 2 and "Traceback" not in too_many.stderr
    assert too_many.stderr.startswith(f"error: --images: {HELD_OUT + 1} images asked for, but the held-out split "
                                      f"has {HELD_OUT}"), too_many.stderr  # fmt: skip
    bad_step = ablate_evaluate(base_url, str(grid), "--images", "4", "--step", "last")
    assert bad_step.returncode == 2
    assert bad_step.stderr.strip() == "error: --step 'last': give final, best or a step number"
    missing = ablate_evaluate(base_url, "999999", "--images", "4")
    assert missing.returncode == 2 and missing.stderr.strip() == f"error: no grid with id 999999 on {base_url}"


def test_an_evaluation_of_16_images_changes_the_reports_n_and_no_runs_step(
    client: TestClient, grid: int, settings: Settings, ray_cluster: str, tmp_path: Path, base_url: str
) -> None:
    before = snapshot(settings.database_url, grid)
    assert effect_ns(client, grid) == {TRAINED_ON}
    accepted = client.post(f"/api/grids/{grid}/evaluations", json={"images": HELD_OUT}, headers=AUTH)
    assert accepted.status_code == 202 and accepted.json()["state"] == "queued", accepted.text
    eid = accepted.json()["id"]
    # A controller that died after placing one job: the next one finds no worker of it and queues it again.
    with session_scope(settings.database_url) as session:
        placed = session.scalars(select(EvaluationResult).where(EvaluationResult.evaluation_id == eid)).first()
        placed.state, placed.node = "running", "local"
    launcher = Launcher(launcher_settings_for(settings.database_url, tmp_path, ray_cluster, max_retries=2))
    launcher.start()
    try:
        done = wait_ended(client, grid, eid)
        assert done["state"] == "completed", done
        assert done["gpu_seconds"] > 0 and all(j["gpu_seconds"] > 0 for j in done["runs"])
        assert {(j["step"], j["val_flow_loss_n"]) for j in done["runs"]} == {(STEPS, HELD_OUT)}
        assert [j["attempt"] for j in done["runs"] if j["id"] == placed.id] == [1]

        # Nothing trained and nothing of training's was written over: the same rows, steps and files.
        assert snapshot(settings.database_url, grid) == before
        with session_scope(settings.database_url) as session:
            for job in session.scalars(select(EvaluationResult).where(EvaluationResult.evaluation_id == eid)):
                trained = session.scalars(select(Metric).where(Metric.run_id == job.run_id, Metric.step == STEPS)).one()
                # Image i with the same noise as in training's own evaluation of the same weights.
                assert job.extra["val_flow_loss_samples"][:TRAINED_ON] == pytest.approx(
                    trained.extra["val_flow_loss_samples"], rel=1e-4)
                assert len(job.extra["val_flow_loss_grid"]) == HELD_OUT and job.val_flow_loss_se is not None

        assert effect_ns(client, grid) == {HELD_OUT}
        report = client.get(f"/api/grids/{grid}/report.json").json()
        assert report["evaluation"] == {"id": eid, "images": HELD_OUT, "step": "final", "samples": None,
                                        "measures": ["recon_lpips", "text_lpips", "text_manip_delta", "val_flow_loss"],
                                        "in_training": 0}  # a user's: every row scored by an evaluation job
        assert f"The effects use evaluation {eid}: each run's final checkpoint evaluated again on {HELD_OUT}" in (
            client.get(f"/api/grids/{grid}/report.md").text)
        # The dashboard's live effects table uses the same evaluation and names it.
        live = client.get(f"/api/dashboard/grids/{grid}").json()
        assert live["evaluation"]["id"] == eid and {e["n"] for e in live["effects"] if e["n"]} == {HELD_OUT}

        # A node that cannot do the job (one run's checkpoints gone) fails it with the reason, which the
        # command, having waited with progress, says; the report keeps the larger completed evaluation.
        with session_scope(settings.database_url) as session:
            first = session.scalars(select(Run).where(Run.grid_id == grid).order_by(Run.id)).first()
            gone, first_id = Path(first.checkpoint_dir), first.id
        aside = gone.with_name(gone.name + ".aside")
        gone.rename(aside)
        try:
            failed = ablate_evaluate(base_url, str(grid), "--images", "8")
        finally:
            shutil.rmtree(gone, ignore_errors=True)
            aside.rename(gone)
        *progress, error = failed.stderr.strip().splitlines()
        assert failed.returncode == 2 and progress and all(re.fullmatch(r"(queued|running|failed): [0-3]/4 runs "
                                                                        r"evaluated", p) for p in progress), progress
        assert error.startswith(f"error: evaluation {eid + 1} failed: run {first_id}: "), error
        assert f"no checkpoint of step {STEPS} in {gone}" in error
        assert client.get(f"/api/grids/{grid}/report.json").json()["evaluation"]["id"] == eid
    finally:
        launcher.stop()
