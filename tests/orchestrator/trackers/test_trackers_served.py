"""A grid served by the launcher (real Ray on CPU, real tiny training) reaches TensorBoard, MLflow and W&B:
every arm's metrics, samples and the detector's decision, then the grid's effects table once its report is
written, read back from each tracker's files; and no tracker
key is in anything a node is given or writes. A module of its own: a fresh database, no other test's runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from orchestrator.db.models import Metric, Run, TrackerRun
from orchestrator.db.session import session_scope
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.settings import Settings
from orchestrator.vocabulary import TrackerName
from tests.kit.polling import wait_for
from tests.kit.settings import tiny_overrides
from tests.orchestrator.trackers.tracker_files import (
    FORWARDING_BOUND_S,
    STOPPED_ARM,
    forwarded_events,
    mlflow_events,
    mlflow_runs,
    tb_text,
    tensorboard_runs,
    tracker_environment,
    wait_closed,
    wait_grid_closed,
    wandb_events,
    wandb_runs,
)

TINY = tiny_overrides(30)
# Two tiny arms take about 20 s on an idle machine and 3 minutes beside two CPU-bound processes; the bound
# only fails the test loudly.
ARMS_BOUND_S = 900.0


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """A Ray with 2 logical GPUs for the launcher's local node (one per arm)."""
    import ray

    ray.init(num_gpus=2, num_cpus=2, namespace="ablate-trackers", include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def effects_sent(database_url: str, grid_id: int) -> bool:
    """Every tracker's grid cursor has passed an effects table."""
    with session_scope(database_url) as session:
        cursors = session.scalars(select(TrackerRun).where(TrackerRun.grid_id == grid_id, TrackerRun.run_id.is_(None)))
        return {c.tracker for c in cursors if c.event_id is not None} == set(TrackerName)


def test_a_grid_run_by_the_launcher_reaches_three_trackers_and_no_tracker_key_reaches_the_node(
    database_url: str, tmp_path: Path, ray_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.loop import loop_listeners
    from orchestrator.runs.launcher import Launcher
    from orchestrator.runs.placement import worker_args

    tracker_environment(tmp_path, monkeypatch)
    key = "wandb-key-that-must-stay-on-the-controller"
    monkeypatch.setenv("WANDB_API_KEY", key)
    settings = Settings(database_url=database_url, home_dir=tmp_path, launcher_interval_s=0.2, worker_threads=1,
                        ray_namespace="ablate-trackers", ray_address=ray_address)  # fmt: skip
    with session_scope(database_url) as session:
        grid = create_grid(session, GridCreate(name="served grid", arms=["A", STOPPED_ARM], overrides=TINY,
                                               trackers=["tensorboard", "mlflow", "wandb"]))  # fmt: skip
        ids, grid_id = [r.id for r in grid.runs], grid.id
    launcher = Launcher(settings, listeners=loop_listeners(settings))
    launcher.start()
    try:
        def ended() -> bool:
            with session_scope(database_url) as session:
                return all(session.get_one(Run, i).state in ("completed", "stopped") for i in ids)

        # Each wait is on the condition the reads below need, read from the database; the trackers' own
        # files are read only once the launcher (and its tracker lanes) stopped writing them.
        wait_for(ended, "both arms to end", timeout=ARMS_BOUND_S)
        for run_id in ids:
            for tracker in TrackerName:
                wait_closed(database_url, run_id, tracker)
        wait_grid_closed(database_url, grid_id, TrackerName.mlflow)
        wait_for(lambda: effects_sent(database_url, grid_id), "the grid's effects table to reach each tracker",
                 timeout=FORWARDING_BOUND_S)  # fmt: skip
    finally:
        launcher.stop()
    assert mlflow_runs()["served grid"].info.status == "FINISHED"
    with session_scope(database_url) as session:
        runs = [session.get_one(Run, i) for i in ids]
        steps = {r.id: session.scalars(select(Metric.step).where(Metric.run_id == r.id).order_by(Metric.step)).all()
                 for r in runs}  # fmt: skip
        # What a node is given for a run, and what it wrote, hold no tracker setting.
        for run in runs:
            assert key not in str(worker_args(settings, run, Path(run.checkpoint_dir), "worker.train:train_arm", None))
            written = [p for p in Path(run.checkpoint_dir).rglob("*") if p.is_file()]
            assert written and not [p for p in written if key.encode() in p.read_bytes()]
    assert [r.state for r in runs] == ["completed", "stopped"] and runs[1].decision == "collapse"
    tb = tensorboard_runs(tmp_path / "tensorboard")
    # The grid's own folder holds its effects table (test_tracker_effects.py reads it row by row).
    assert tb_text(tb.pop(f"grid-{grid_id}-served-grid"), "effects")[0][1].startswith("effects, final report")
    assert {arm: [e.step for e in acc.Scalars("val_flow_loss")] for arm, acc in tb.items()} == {
        "A": steps[ids[0]], "A-flipped": steps[ids[1]]}  # fmt: skip
    assert all(acc.Tags()["images"] for acc in tb.values())
    assert tb_text(tb["A-flipped"], "decision")[0][1].startswith(f"collapse at step {runs[1].decision_step}")
    mlflow = mlflow_runs()
    assert mlflow["A-flipped"].data.tags["ablate.decision_reason"] == runs[1].decision_reason
    assert mlflow["A"].data.tags["ablate.state"] == "completed"
    wb = wandb_runs(tmp_path / "wandb")
    assert {arm: [row["_step"] for part in parts for row in part.history] for arm, parts in wb.items()} == {
        "A": steps[ids[0]], "A-flipped": steps[ids[1]]}  # fmt: skip
    # Each run's last part holds the grid's effects table: a part resumed after the run's end, or the end's
    # own part where the table was sent before the end went out (which comes first is the lanes' timing).
    assert [part.summary["effects_at"] for parts in wb.values() for part in parts[-1:]] == ["final report"] * 2
    ended = {arm: [part for part in parts if "events" in part.summary][-1] for arm, parts in wb.items()}
    assert ended["A-flipped"].summary["decision"] == "collapse"
    for arm, run_id in (("A", ids[0]), ("A-flipped", ids[1])):  # every event, not only the latest
        events = forwarded_events(database_url, run_id)
        assert len(events) >= 2 and events[0][0] == "started" and events[-1][0] in ("completed", "stopped")
        assert [(kind, message) for _, kind, message in wandb_events(ended[arm])] == events
        assert [(e["kind"], e["message"]) for e in mlflow_events(mlflow[arm].info.run_id)] == events
