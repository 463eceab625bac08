"""The distribution metrics reach TensorBoard, MLflow and W&B like every per-checkpoint metric, at the
checkpoints the pass measured, with the extractor's label beside them (a stand-in says so). Read back from each
tracker's own files, offline; records as a worker writes them, through the controller's ingest."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.db.models import Run
from orchestrator.db.session import session_scope
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.runs.ingest import ingest
from orchestrator.trackers.forwarder import Forwarder
from orchestrator.vocabulary import RunState, TrackerName
from tests.orchestrator.trackers.tracker_files import (
    mlflow_runs,
    settings_for,
    tb_text,
    tensorboard_runs,
    wandb_runs,
)

LABEL = "clip-vit-l-14-336 (random stand-in)"
MEASURED = {20: (1.5, 0.05, 3.2), 40: (1.1, 0.04, 3.0)}  # step: (cmmd, fd_dinov2, pass seconds); 10, 30 skipped


def _record(step: int) -> dict:
    record = {"step": step, "train_loss": 0.5, "val_flow_loss": 0.4 - step / 1000, "val_flow_loss_se": 0.01}
    if step in MEASURED:
        cmmd, fd, seconds = MEASURED[step]
        record |= {"cmmd": cmmd, "cmmd_se": 0.1, "cmmd_n": 32, "cmmd_extractor": LABEL, "cmmd_samples": [cmmd] * 32,
                   "fd_dinov2": fd, "fd_dinov2_se": 0.01, "fd_dinov2_n": 32, "fd_dinov2_extractor": "dinov2-vit-b-14",
                   "distribution_seconds": seconds}  # fmt: skip
    return record


def test_distribution_metrics_reach_every_tracker_at_their_steps_with_the_extractor(
    database_url: str, tmp_path: Path, tracker_env: Path
) -> None:
    arm = {"parent": "A", "name": "A", "eval": {"distribution": {"metrics": ["cmmd", "fd_dinov2"], "samples": 32}}}
    with session_scope(database_url) as session:
        grid = create_grid(session, GridCreate(name="distribution", arms=[arm], trackers=list(TrackerName)))
        (run,) = grid.runs
        run.state = RunState.running
        run_id = run.id
    with session_scope(database_url) as session:
        run = session.get_one(Run, run_id)
        ingest(session, run, [_record(s) for s in (10, 20, 30, 40)])
        run.state = RunState.completed
    forwarder = Forwarder(settings_for(database_url, tmp_path))
    try:
        for name in TrackerName:
            forwarder.forward(name)
    finally:
        forwarder.stop()
    cmmd = [(s, v[0]) for s, v in MEASURED.items()]
    seconds = [(s, v[2]) for s, v in MEASURED.items()]

    (tb,) = tensorboard_runs(tmp_path / "tensorboard").values()
    assert [(e.step, pytest.approx(e.value)) for e in tb.Scalars("cmmd")] == cmmd
    assert [e.step for e in tb.Scalars("fd_dinov2_se")] == [20, 40]
    assert [(e.step, pytest.approx(e.value)) for e in tb.Scalars("distribution_seconds")] == seconds
    assert tb_text(tb, "cmmd_extractor") == [(20, LABEL), (40, LABEL)]

    from mlflow.tracking import MlflowClient

    run = mlflow_runs()["A"]
    history = MlflowClient().get_metric_history(run.info.run_id, "cmmd")
    assert sorted((m.step, pytest.approx(m.value)) for m in history) == cmmd
    assert run.data.tags["ablate.cmmd_extractor"] == LABEL
    assert run.data.tags["ablate.fd_dinov2_extractor"] == "dinov2-vit-b-14"

    ((wb,),) = wandb_runs(tmp_path / "wandb").values()
    assert [(row["_step"], pytest.approx(row["cmmd"])) for row in wb.history if "cmmd" in row] == cmmd
    assert [row["_step"] for row in wb.history] == [10, 20, 30, 40]
    assert wb.summary["cmmd_extractor"] == LABEL
