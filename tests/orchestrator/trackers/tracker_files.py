"""Reading each tracker back from its own files (TensorBoard event files, an MLflow store through MlflowClient,
W&B offline runs), and the tracker environment of a test: shared by the tracker tests."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from orchestrator.db.models import TrackerRun
from orchestrator.db.session import session_scope
from orchestrator.settings import Settings
from tests.kit.polling import wait_for

# An arm whose detector stops it at its first lower flow loss, by taking higher as better (a sign flip the
# tiny run's falling loss is sure to trip).
STOPPED_ARM = {"parent": "A", "name": "A-flipped", "detector": {
    "metric": "val_flow_loss", "metric_mode": "max", "worsening_checkpoints": 1, "margin_abs": 0, "margin_se": 0,
    "assumed_se": None, "secondary": {}}}


def tracker_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B offline and an MLflow file store under tmp_path; nothing leaves the machine."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("WANDB_PROJECT", "ablate-test")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "ablate-test")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store for those who ask


def settings_for(database_url: str, tmp_path: Path, **kw: Any) -> Settings:
    """A controller's settings for a tracker test: its database, home under tmp_path, a fast launcher."""
    return Settings(database_url=database_url, home_dir=tmp_path, launcher_interval_s=0.2, **kw)


def tensorboard_runs(root: Path) -> dict[str, Any]:
    """Arm folder -> its EventAccumulator (every event file of the folder, as TensorBoard reads it)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = {}
    for folder in sorted({p.parent for p in root.rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
        acc.Reload()
        out[folder.name] = acc
    return out


def tb_text(acc: Any, tag: str) -> list[tuple[int, str]]:  # noqa: ANN401 - an EventAccumulator
    """The tag's texts by step, as typed: a node-supplied text is written as a Markdown code block
    (tensorboard_sink.literal), read back here without its fence."""
    if f"{tag}/text_summary" not in acc.Tags()["tensors"]:
        return []
    return [(e.step, unfenced(e.tensor_proto.string_val[0].decode())) for e in acc.Tensors(f"{tag}/text_summary")]


def unfenced(text: str) -> str:
    """A Markdown code block's content; any other text as it is."""
    lines = text.split("\n")
    fence = lines[0]
    if len(lines) >= 2 and len(fence) >= 3 and set(fence) == {"`"} and lines[-1] == fence:
        return "\n".join(lines[1:-1])
    return text


def mlflow_runs() -> dict[str, Any]:
    """Run name -> MLflow run, in the test's experiment."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    experiment = client.get_experiment_by_name("ablate-test")
    return {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}


def wandb_runs(root: Path) -> dict[str, Any]:
    """W&B run name -> its offline run(s) read back (orchestrator/trackers/exports.py reads .wandb files)."""
    from orchestrator.trackers.exports import read_wandb_run

    runs: dict[str, Any] = {}
    for path in sorted(root.rglob("run-*.wandb")):
        run = read_wandb_run(path)
        runs.setdefault(run.name, []).append(run)
    return runs


def wandb_events(run: Any) -> list[list[Any]]:  # noqa: ANN401 - a WandbRun read back
    """The rows of the run's summary `events` table, from the table file the offline run wrote."""
    import json

    table = run.summary["events"]
    assert table["_type"] == "table-file"
    return json.loads((run.path.parent / "files" / table["path"]).read_text())["data"]


def mlflow_events(run_id: str) -> list[dict[str, Any]]:
    """The MLflow run's events.json artifact, read back through MlflowClient."""
    import json

    from mlflow.tracking import MlflowClient

    with tempfile.TemporaryDirectory() as folder:
        return json.loads(Path(MlflowClient().download_artifacts(run_id, "events.json", folder)).read_text())


def forwarded_events(database_url: str, run_id: int) -> list[tuple[str, str]]:
    """(kind, message) of every event of the run a tracker is sent (FORWARDED_EVENTS), oldest first."""
    from orchestrator.db.models import Event
    from orchestrator.trackers.forwarder import FORWARDED_EVENTS

    with session_scope(database_url) as session:
        return [(e.kind, e.message) for e in session.scalars(
            select(Event).where(Event.run_id == run_id, Event.kind.in_(FORWARDED_EVENTS)).order_by(Event.id))]


# A bound on a tracker lane's work once the runs ended, under a loaded 2-core machine: it only fails a test
# loudly (the lanes poll every 0.2 s and take a few seconds idle), it never times anything.
FORWARDING_BOUND_S = 300.0


def wait_closed(database_url: str, run_id: int, tracker: str) -> None:
    def closed() -> bool:
        with session_scope(database_url) as session:
            return bool(session.scalar(select(TrackerRun.closed).where(TrackerRun.run_id == run_id,
                                                                       TrackerRun.tracker == tracker)))

    wait_for(closed, f"run {run_id}'s {tracker} run to be closed", timeout=FORWARDING_BOUND_S)


def wait_grid_closed(database_url: str, grid_id: int, tracker: str) -> None:
    """Wait until the lane finished the grid's own tracker run (an MLflow parent run): read from the lane's
    cursor, which it sets only after the tracker took the end. Never poll the tracker's files while a lane
    writes them: MLflow's file store rewrites a run's meta.yaml in place, and a read in between fails."""

    def closed() -> bool:
        with session_scope(database_url) as session:
            return bool(session.scalar(select(TrackerRun.closed).where(
                TrackerRun.grid_id == grid_id, TrackerRun.run_id.is_(None), TrackerRun.tracker == tracker)))

    wait_for(closed, f"grid {grid_id}'s {tracker} run to be finished", timeout=FORWARDING_BOUND_S)
