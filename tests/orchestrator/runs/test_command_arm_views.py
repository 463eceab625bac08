"""A command arm on the dashboard and in the report, from a real run (local Ray, the real launcher and
database): its own metrics are series by their names, and the PNGs its script writes to
ABLATE_RUN_DIR/samples/step_N/ are served and shown as a built-in arm's samples are."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from fastapi.testclient import TestClient

from orchestrator.app import create_app
from orchestrator.dashboard.data import grid_detail
from orchestrator.db.models import Grid
from orchestrator.db.session import session_scope
from orchestrator.grids.service import GridCreate, PathPolicy, create_grid
from orchestrator.results.reports.build import build_report
from orchestrator.results.reports.render import to_html, to_markdown
from orchestrator.runs.launcher import Launcher
from orchestrator.settings import Settings
from orchestrator.vocabulary import TERMINAL_STATES
from tests.kit.polling import wait_for

STAND_IN = Path(__file__).resolve().parent / "command_trainer"
NAMESPACE = "ablate-command-views"


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    ray.init(num_gpus=2, num_cpus=2, namespace=NAMESPACE, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def test_a_command_arm_s_metrics_and_pictures_on_the_dashboard_and_in_the_report(
    ray_address: str, database_url: str, tmp_path: Path
) -> None:
    settings = Settings(database_url=database_url, home_dir=tmp_path, launcher_interval_s=0.2,
                        worker_threads=1, ray_namespace=NAMESPACE, ray_address=ray_address)  # fmt: skip
    arm = {"name": "pictures", "code": str(STAND_IN), "command": [sys.executable, "train.py", "--steps", "30", "--png"],
           "detector": {"metric": "val_loss"}}  # fmt: skip
    with session_scope(database_url) as session:
        grid = create_grid(session, GridCreate(name="views", arms=[arm]),
                           paths=PathPolicy(allow_commands=True, command_dirs=[STAND_IN]))  # fmt: skip
        grid_id, run_id = grid.id, grid.runs[0].id
    launcher = Launcher(settings)
    launcher.start()
    try:
        def ended() -> bool:
            with session_scope(database_url) as session:
                return session.get_one(Grid, grid_id).runs[0].state in TERMINAL_STATES

        wait_for(ended, "the command arm to finish", timeout=120)
    finally:
        launcher.stop()

    with session_scope(database_url) as session:
        grid = session.get_one(Grid, grid_id)
        assert grid.runs[0].state == "completed", grid.runs[0].error
        (row,) = grid_detail(session, grid)["runs"]
        html, markdown = to_html(build_report(session, grid)), to_markdown(build_report(session, grid))
    # Its own metrics, by its names (val_loss and recon_mse live in Metric.extra), and nothing of ablate's.
    assert row["own_metrics"] == ["val_loss", "resumed_from", "recon_mse"]
    assert row["series"]["step"] == [10, 20, 30]
    assert row["series"]["val_loss"] == pytest.approx([1 / 10, 1 / 20, 1 / 30])
    assert row["series"]["recon_mse"] == pytest.approx([0.01, 0.02, 0.03])
    # Its pictures: one per step, served through the samples API as a built-in arm's are.
    assert row["samples"]["steps"] == [10, 20, 30]
    assert [(f["file"], f["kind"], f["caption"]) for f in row["samples"]["files"]] == [("own_0.png", "own", "grid.png")]
    with TestClient(create_app(settings, "token")) as client:
        png = client.get(f"/api/runs/{run_id}/samples/20/own_0.png")
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG") and png.content[-12:-8] == b"\0\0\0\0"
    # The report: a curve per metric of its own, its picture at its best step embedded, the values said.
    assert 'aria-label="val_loss per arm"' in html and 'aria-label="recon_mse per arm"' in html
    assert "data:image/png;base64," in html
    assert "Its own metrics at step 30: val_loss 0.0333, resumed_from 0.0000, recon_mse 0.0300." in markdown
