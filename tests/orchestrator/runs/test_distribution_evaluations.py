"""Sample quality end to end, offline: a tiny 2-arm x 2-seed grid with eval.distribution (cmmd, fd_dinov2 on 32
samples) trained on the CPU, its report's CMMD effect crossed over 32 samples and naming the stand-in extractor;
then POST /api/grids/{id}/evaluations {"samples": 64, "metrics": ["cmmd"]} on a node of real Ray, which trains
nothing, and the report's CMMD effect over 64 samples. The controller's checks of a node's distribution values."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from orchestrator.db.models import EvaluationResult, Metric, Run
from orchestrator.db.session import session_scope
from orchestrator.runs.evaluation_record import refused_distribution
from orchestrator.runs.launcher import Launcher
from orchestrator.settings import Settings
from tests.kit.launcher import launcher_settings_for
from tests.kit.net import served
from tests.kit.polling import wait_for
from tests.kit.settings import AUTH, tiny_overrides
from tests.kit.trained_runs import train_grid_runs

HELD_OUT, SAMPLES, MORE, STEPS = 64, 32, 64, 10
CLI_TOKEN = "distribution-test-token"


@pytest.fixture(scope="module")
def grid(client: TestClient, settings: Settings) -> int:
    overrides = tiny_overrides(STEPS)
    overrides["data"] |= {"held_out": HELD_OUT, "split_seed": 3}  # one split: every seed shares the reference
    overrides["eval"] |= {"num_samples": 4, "distribution": {"metrics": ["cmmd", "fd_dinov2"], "samples": SAMPLES,
                                                             "sampler_steps": 2}}  # fmt: skip
    resp = client.post("/api/grids", json={"name": "sample quality", "arms": ["A", "B"], "overrides": overrides,
                                           "seeds": 2}, headers=AUTH)  # fmt: skip
    assert resp.status_code == 201, resp.text
    grid_id = resp.json()["id"]
    train_grid_runs(settings, grid_id)
    return grid_id


def cmmd_effects(client: TestClient, grid_id: int) -> list[dict]:
    report = client.get(f"/api/grids/{grid_id}/report.json").json()
    return [e for e in report["effects"] if e["metric"] == "cmmd"]


def test_the_report_carries_cmmd_effects_over_the_samples_naming_the_standin(client: TestClient, grid: int) -> None:
    effects = cmmd_effects(client, grid)
    assert effects and all(e["n"] == SAMPLES and e["interval"] == "crossed" for e in effects)
    assert all(e["low"] is not None and e["high"] is not None and e["low"] <= e["diff"] <= e["high"] for e in effects)
    assert all(e["standin"] and "stand-in" in e["extractor"] for e in effects)
    markdown = client.get(f"/api/grids/{grid}/report.md").text
    assert "CMMD (clip-vit-l-14-336 small random stand-in (no weights): stand-in extractor: descriptive)" in markdown
    assert "FD-DINOv2 (dinov2-vit-b-14 small random stand-in (no weights)" in markdown


@pytest.mark.parametrize(("body", "field", "needle"), [
    ({"samples": HELD_OUT + 1, "metrics": ["cmmd"]}, "samples", f"the held-out split has {HELD_OUT} images"),
    ({"samples": 32, "metrics": ["fid"]}, "metrics", "use fd_dinov2"),
    ({"samples": 4, "metrics": ["cmmd"]}, "samples", "greater than or equal to 8"),
])  # fmt: skip
def test_a_bad_distribution_request_is_a_422_naming_its_field(client: TestClient, grid: int, body: dict, field: str,
                                                              needle: str) -> None:  # fmt: skip
    resp = client.post(f"/api/grids/{grid}/evaluations", json=body, headers=AUTH)
    assert resp.status_code == 422, resp.text
    error = resp.json()["detail"][0]
    assert error["loc"][:2] == ["body", field] and needle in error["msg"], error


def test_the_controller_refuses_distribution_values_the_samples_do_not_give() -> None:
    good = {"cmmd": 0.5, "cmmd_se": 0.1, "cmmd_n": 4, "cmmd_extractor": "x", "cmmd_samples": [0.2, 0.4, 0.6, 0.8]}
    assert refused_distribution(good, 4, ["cmmd"]) is None
    assert "cmmd_n 3, not the 4 samples" in refused_distribution(good | {"cmmd_n": 3}, 4, ["cmmd"])
    assert "not the mean of its cmmd_samples" in refused_distribution(good | {"cmmd": 0.1}, 4, ["cmmd"])
    assert "3 finite values in cmmd_samples" in refused_distribution(good | {"cmmd_samples": [0.5] * 3}, 4, ["cmmd"])
    assert "names its extractor" in refused_distribution({**good, "cmmd_extractor": None}, 4, ["cmmd"])
    assert "not a finite value" in refused_distribution(good | {"cmmd": "nan"}, 4, ["cmmd"])
    assert "fd_dinov2_n None" in refused_distribution(good, 4, ["cmmd", "fd_dinov2"])  # asked, not measured
    assert refused_distribution(good | {"cmmd_per_reference": [0.1, 0.5, 0.9]}, 4, ["cmmd"]) is None
    for refs in ([0.5, 0.5], [0.5, "nan", 0.5], "0.5"):  # the reference's values: 3 or more finite numbers
        assert "cmmd_per_reference: not a list of 3" in refused_distribution(good | {"cmmd_per_reference": refs},
                                                                              4, ["cmmd"])  # fmt: skip


def test_an_evaluation_on_64_samples_trains_nothing_and_the_reports_cmmd_n_becomes_64(
    client: TestClient, grid: int, settings: Settings, ray_cluster: str, tmp_path: Path
) -> None:
    with session_scope(settings.database_url) as session:
        ids = [r.id for r in session.scalars(select(Run).where(Run.grid_id == grid))]
        before = sorted((m.run_id, m.step, m.val_flow_loss) for m in session.scalars(
            select(Metric).where(Metric.run_id.in_(ids))))  # fmt: skip
    accepted = client.post(f"/api/grids/{grid}/evaluations", json={"samples": MORE, "metrics": ["cmmd"]}, headers=AUTH)
    assert accepted.status_code == 202, accepted.text
    eid = accepted.json()["id"]
    launcher = Launcher(launcher_settings_for(settings.database_url, tmp_path, ray_cluster))
    launcher.start()
    try:
        def ended() -> dict | None:
            got = client.get(f"/api/grids/{grid}/evaluations/{eid}").json()
            return got if got["state"] in ("completed", "failed") else None

        done = wait_for(ended, f"evaluation {eid} to end", timeout=240, interval=0.5)
    finally:
        launcher.stop()
    assert done["state"] == "completed", done
    assert (done["samples"], done["metrics"]) == (MORE, ["cmmd"])
    assert {(j["step"], j["distribution"]["cmmd_n"]) for j in done["runs"]} == {(STEPS, MORE)}
    assert all(j["distribution"]["distribution_seconds"] > 0 for j in done["runs"])
    with session_scope(settings.database_url) as session:  # no training step: the same rows
        after = sorted((m.run_id, m.step, m.val_flow_loss) for m in session.scalars(
            select(Metric).where(Metric.run_id.in_(ids))))  # fmt: skip
        jobs = session.scalars(select(EvaluationResult).where(EvaluationResult.evaluation_id == eid)).all()
        assert jobs and {len(j.extra["cmmd_per_reference"]) for j in jobs} == {HELD_OUT}  # one per reference image
    assert after == before
    effects = cmmd_effects(client, grid)
    assert effects and {e["n"] for e in effects} == {MORE} and all(e["low"] is not None for e in effects)


@pytest.fixture(scope="module")
def base_url(settings: Settings) -> Iterator[str]:
    from orchestrator.app import create_app

    with served(create_app(settings, CLI_TOKEN)) as url:
        yield url


def test_the_command_says_a_bad_samples_in_one_line(base_url: str, grid: int) -> None:
    env = {**os.environ, "ABLATE_API_TOKEN": CLI_TOKEN, "COLUMNS": "200", "NO_COLOR": "1"}
    cmd = [sys.executable, "-m", "orchestrator.cli", "evaluate", str(grid), "--samples", str(HELD_OUT + 1),
           "--metrics", "cmmd", "--url", base_url]  # fmt: skip
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().startswith(f"error: --samples: {HELD_OUT + 1} samples asked for"), out.stderr
