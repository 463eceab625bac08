"""Experiment trackers as sinks: what the controller ingested reaches TensorBoard, MLflow and W&B, read back
from each tracker's own files (TensorBoard event files, an MLflow file store through MlflowClient, a W&B
offline run), with no network. Real tiny training on CPU writes the records and sample images; a real
migrated database holds them; the forwarder runs its passes in the test's thread."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from orchestrator.db.events import record_event
from orchestrator.db.models import Event, Metric, Run, TrackerRun
from orchestrator.db.session import session_scope
from orchestrator.grids.arms import resolve
from orchestrator.grids.service import GridCreate, GridError, create_grid
from orchestrator.runs.ingest import ingest
from orchestrator.trackers.base import Opened, Point, Status, TrackedRun
from orchestrator.trackers.forwarder import Forwarder
from orchestrator.vocabulary import RunState, TrackerName
from tests.kit.net import free_port
from tests.kit.polling import wait_for
from tests.kit.settings import tiny_overrides
from tests.orchestrator.trackers.tracker_files import (
    STOPPED_ARM,
    forwarded_events,
    mlflow_events,
    mlflow_runs,
    settings_for,
    tb_text,
    tensorboard_runs,
    wait_closed,
    wandb_events,
    wandb_runs,
)
from worker.train import train_arm

TINY = tiny_overrides(30)
@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """One tiny arm's real run folder and records (checkpoints 10, 20, 30, with sample images)."""
    out = tmp_path_factory.mktemp("run")
    return out, list(train_arm(resolve("A", TINY), out))


def submit(database_url: str, trackers: list[str], out: Path, arms: list | None = None) -> list[int]:
    """A grid naming `trackers`, its runs running from `out` (the trained run folder)."""
    with session_scope(database_url) as session:
        body = GridCreate(name="tracked grid", arms=arms or ["A", STOPPED_ARM], overrides=TINY, trackers=trackers)
        grid = create_grid(session, body)
        for run in grid.runs:
            run.state, run.checkpoint_dir = RunState.running, str(out)
            record_event(session, run, "started", "on node local")
        return [r.id for r in grid.runs]


def ingest_and_end(database_url: str, run_ids: list[int], records: list[dict[str, Any]], end: bool) -> None:
    """What the launcher does with a worker's reply: store the records (the detector judges them), and
    when `end`, finish each run as its worker ended (stopped when the detector asked, else completed)."""
    with session_scope(database_url) as session:
        for run_id in run_ids:
            run = session.get_one(Run, run_id)
            ingest(session, run, records)
            if end:
                run.state = RunState.stopped if run.being_stopped else RunState.completed
                record_event(session, run, run.state, f"ended at step {run.last_checkpoint_step}")


def forward(forwarder: Forwarder, *names: TrackerName) -> None:
    for name in names:
        forwarder.forward(name)


# -- the tests --------------------------------------------------------------------------------------


def test_a_grid_names_its_trackers_and_a_missing_client_is_refused_naming_the_extra(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with session_scope(database_url) as session, pytest.raises(GridError) as err:
        create_grid(session, GridCreate(name="t", arms=["A"], trackers=["tensorboard", "wandb", "tensorboard"]))
    problems = {tuple(e["loc"]): e["msg"] for e in err.value.errors}
    assert "pip install 'ablate-dit[wandb]'" in problems[("trackers", 1)]
    assert "named twice" in problems[("trackers", 2)]
    with session_scope(database_url) as session, pytest.raises(GridError) as err:  # the installation's default
        create_grid(session, GridCreate(name="t", arms=["A"]), default_trackers=[TrackerName.wandb])
    assert "ABLATE_TRACKERS names wandb" in err.value.errors[0]["msg"]
    with session_scope(database_url) as session:
        named = create_grid(session, GridCreate(name="t", arms=["A"], trackers=[]), default_trackers=["mlflow"])
        default = create_grid(session, GridCreate(name="t", arms=["A"]), default_trackers=[TrackerName.mlflow])
        assert (named.trackers, default.trackers) == ([], ["mlflow"])


def test_submission_answers_422_naming_the_extra_and_the_grid_shows_its_trackers(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    from fastapi.testclient import TestClient

    from orchestrator.app import create_app

    token = "tracker-test-token"
    auth = {"Authorization": f"Bearer {token}"}
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with TestClient(create_app(settings_for(database_url, tmp_path, trackers=["tensorboard"]), token)) as client:
        refused = client.post("/api/grids", json={"name": "t", "arms": ["A"], "trackers": ["mlflow"]}, headers=auth)
        assert refused.status_code == 422
        assert refused.json()["detail"] == [{"loc": ["body", "trackers", 0], "type": "value_error",
                                             "msg": "the mlflow tracker needs its client on the controller: "
                                                    "pip install 'ablate-dit[mlflow]'"}]  # fmt: skip
        unknown = client.post("/api/grids", json={"name": "t", "arms": ["A"], "trackers": ["comet"]}, headers=auth)
        assert unknown.status_code == 422 and unknown.json()["detail"][0]["loc"] == ["body", "trackers", 0]
        created = client.post("/api/grids", json={"name": "t", "arms": ["A"]}, headers=auth)  # ABLATE_TRACKERS
        assert client.get(f"/api/grids/{created.json()['id']}").json()["trackers"] == ["tensorboard"]


def test_every_arm_reaches_all_three_trackers_with_metrics_samples_and_the_decision(
    database_url: str, tmp_path: Path, tracker_env: Path, trained: tuple[Path, list[dict[str, Any]]]
) -> None:
    out, records = trained
    ids = submit(database_url, ["tensorboard", "mlflow", "wandb"], out)
    ingest_and_end(database_url, ids, records, end=True)
    forwarder = Forwarder(settings_for(database_url, tmp_path))
    try:
        forward(forwarder, *TrackerName)
    finally:
        forwarder.stop()
    steps = [r["step"] for r in records]
    loss = {r["step"]: r["val_flow_loss"] for r in records}
    samples = {f["file"] for f in records[-1]["samples"]["files"]}
    assert {"recon_0.png", "target_0.png"} <= samples
    with session_scope(database_url) as session:
        stopped = session.get_one(Run, ids[1])
        assert (stopped.state, stopped.decision) == ("stopped", "collapse") and stopped.decision_step in steps
        reason, decided = stopped.decision_reason, stopped.decision_step
        cursors = session.scalars(select(TrackerRun).where(TrackerRun.run_id.in_(ids))).all()
        assert {(c.tracker, c.step, c.closed) for c in cursors} == {(t, steps[-1], True) for t in TrackerName}

    # TensorBoard: one folder per arm; each checkpoint's metrics with their SEs at its step; the samples.
    tb = tensorboard_runs(tmp_path / "tensorboard")
    assert set(tb) == {"A", "A-flipped"}
    for acc in tb.values():
        assert [(e.step, pytest.approx(e.value)) for e in acc.Scalars("val_flow_loss")] == list(loss.items())
        assert [e.step for e in acc.Scalars("val_flow_loss_se")] == steps
        assert [e.step for e in acc.Scalars("judged")] == steps
        images = {tag.removeprefix("samples/") + ".png" for tag in acc.Tags()["images"]}
        assert images == samples and [e.step for e in acc.Images("samples/recon_0")] == steps
    assert tb_text(tb["A-flipped"], "decision") == [(decided, f"collapse at step {decided}: {reason}")]
    assert tb_text(tb["A"], "decision") == []

    # MLflow: the grid as the parent run, each arm a child with the metrics, the samples as artifacts, tags.
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    runs = mlflow_runs()
    parent = runs["tracked grid"].info.run_id
    for arm in ("A", "A-flipped"):
        run = runs[arm]
        assert run.data.tags["mlflow.parentRunId"] == parent
        history = client.get_metric_history(run.info.run_id, "val_flow_loss")
        assert [(m.step, pytest.approx(m.value)) for m in history] == list(loss.items())
        assert run.data.params["model.size"] == "tiny"
        files = {Path(f.path).name for f in client.list_artifacts(run.info.run_id, f"samples/step_{steps[-1]:07d}")}
        assert files == samples
    flipped = runs["A-flipped"]
    assert flipped.data.tags["ablate.decision"] == "collapse" and flipped.data.tags["ablate.decision_reason"] == reason
    assert (flipped.info.status, runs["A"].info.status) == ("KILLED", "FINISHED")
    # Every event of each arm (started, the decision, the end), not only the latest; the grid's parent run is
    # closed once both arms ended (a detector's stop is a grid's normal end).
    events = {arm: forwarded_events(database_url, run_id) for arm, run_id in zip(("A", "A-flipped"), ids, strict=True)}
    assert [kind for kind, _ in events["A-flipped"]] == ["started", "decision", "stopped"]
    for arm in ("A", "A-flipped"):
        assert [(e["kind"], e["message"]) for e in mlflow_events(runs[arm].info.run_id)] == events[arm]
    assert runs["tracked grid"].info.status == "FINISHED" and runs["tracked grid"].info.end_time is not None
    assert runs["tracked grid"].data.tags["ablate.runs"] == "1 completed, 1 stopped"

    # W&B (offline): a run per arm in the grid's group, history at its steps, images, the decision in the summary.
    wb = wandb_runs(tmp_path / "wandb")
    assert set(wb) == {"A", "A-flipped"}
    for (run,) in wb.values():
        assert run.group.startswith("tracked grid")
        assert [(row["_step"], pytest.approx(row["val_flow_loss"])) for row in run.history] == list(loss.items())
        for row in run.history:
            images = {k.removeprefix("samples/") + ".png" for k, v in row.items() if k.startswith("samples/")
                      and v["_type"] == "image-file"}  # fmt: skip
            assert images == samples
        assert run.config["model"]["size"] == "tiny"
    summary = wb["A-flipped"][0].summary
    assert (summary["decision"], summary["decision_reason"], summary["state"]) == ("collapse", reason, "stopped")
    for arm, (run,) in wb.items():
        assert [(kind, message) for _, kind, message in wandb_events(run)] == events[arm]


def test_a_restarted_controller_continues_each_tracker_run_without_duplicating_points(
    database_url: str, tmp_path: Path, tracker_env: Path, trained: tuple[Path, list[dict[str, Any]]]
) -> None:
    out, records = trained
    ids = submit(database_url, ["tensorboard", "mlflow", "wandb"], out, arms=["A"])
    ingest_and_end(database_url, ids, records[:2], end=False)
    first = Forwarder(settings_for(database_url, tmp_path))
    forward(first, *TrackerName)
    first.stop()  # the controller goes away; the arm trains on
    assert mlflow_runs()["tracked grid"].info.status == "RUNNING"  # the grid goes on: its parent run too
    with session_scope(database_url) as session:  # a cursor left behind the last point: the one in flight
        cursor = session.scalar(select(TrackerRun).where(TrackerRun.run_id == ids[0], TrackerRun.tracker == "mlflow"))
        assert cursor.step == records[1]["step"]
        ids_before = {c.tracker: c.external_id for c in session.scalars(select(TrackerRun).where(
            TrackerRun.run_id == ids[0]))}  # fmt: skip
        session.get_one(Run, ids[0]).retries = 1
        record_event(session, session.get_one(Run, ids[0]), "resumed", "attempt 1 resumes from step 20")
    # The worker re-sends everything on resume; ingest stores only the new checkpoint.
    ingest_and_end(database_url, ids, records, end=True)
    second = Forwarder(settings_for(database_url, tmp_path))
    forward(second, *TrackerName)
    second.stop()

    steps = [r["step"] for r in records]
    with session_scope(database_url) as session:
        ids_after = {c.tracker: c.external_id for c in session.scalars(select(TrackerRun).where(
            TrackerRun.run_id == ids[0]))}  # fmt: skip
    assert ids_after == ids_before
    (acc,) = tensorboard_runs(tmp_path / "tensorboard").values()
    assert [e.step for e in acc.Scalars("val_flow_loss")] == steps
    from mlflow.tracking import MlflowClient

    mlflow_run = mlflow_runs()["A"]
    assert mlflow_run.info.run_id == ids_before["mlflow"]
    assert [m.step for m in MlflowClient().get_metric_history(mlflow_run.info.run_id, "val_flow_loss")] == steps
    (parts,) = wandb_runs(tmp_path / "wandb").values()
    assert {p.run_id for p in parts} == {ids_before["wandb"]} and len(parts) == 2  # the same W&B run, resumed
    assert sorted(row["_step"] for p in parts for row in p.history) == steps
    # The event list survives the restart: what the first controller sent is still in what the second wrote.
    events = forwarded_events(database_url, ids[0])
    assert [kind for kind, _ in events] == ["started", "resumed", "completed"]
    assert [(e["kind"], e["message"]) for e in mlflow_events(mlflow_run.info.run_id)] == events
    assert [(kind, message) for _, kind, message in wandb_events(parts[-1])] == events
    assert mlflow_runs()["tracked grid"].info.status == "FINISHED"


def test_mlflow_closes_the_grids_parent_run_only_when_its_last_run_ended(
    database_url: str, tmp_path: Path, tracker_env: Path, trained: tuple[Path, list[dict[str, Any]]]
) -> None:
    from orchestrator.db.models import Grid
    from orchestrator.grids.stopping import stop_grid

    out, records = trained
    ids = submit(database_url, ["mlflow"], out, arms=["A", "B"])
    ingest_and_end(database_url, ids[:1], records, end=True)  # A ended; B still trains
    forwarder = Forwarder(settings_for(database_url, tmp_path))
    try:
        forward(forwarder, TrackerName.mlflow)
        assert mlflow_runs()["tracked grid"].info.status == "RUNNING"
        with session_scope(database_url) as session:  # the user stops the grid; B's worker ends after its step
            grid_id = session.get_one(Run, ids[1]).grid_id
            stop_grid(session, session.get_one(Grid, grid_id))
            b = session.get_one(Run, ids[1])
            b.state = RunState.stopped
            record_event(session, b, "stopped", "stopped by the user at step 0")
        forward(forwarder, TrackerName.mlflow)
    finally:
        forwarder.stop()
    parent = mlflow_runs()["tracked grid"]
    assert (parent.info.status, parent.data.tags["ablate.state"]) == ("KILLED", "stopped")
    assert parent.data.tags["ablate.runs"] == "1 completed, 1 stopped"
    assert [e["kind"] for e in mlflow_events(mlflow_runs()["B"].info.run_id)] == ["started", "stop_requested",
                                                                                 "stopped"]  # fmt: skip
    with session_scope(database_url) as session:
        group = session.scalar(select(TrackerRun).where(TrackerRun.grid_id == grid_id, TrackerRun.run_id.is_(None),
                                                        TrackerRun.tracker == "mlflow"))  # fmt: skip
        assert group.closed


def test_mlflow_artifacts_go_beside_a_database_store_not_into_the_controllers_working_folder(
    database_url: str, tmp_path: Path, tracker_env: Path, trained: tuple[Path, list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MLFLOW_TRACKING_URI names an SQLite store elsewhere: the run's spec, events and samples land in `mlruns`
    beside that file, and the controller's working folder gets no ./mlruns (MLflow's client default)."""
    store = tmp_path / "store"
    store.mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store / 'mlflow.db'}")
    working = tmp_path / "controller-cwd"
    working.mkdir()
    monkeypatch.chdir(working)
    out, records = trained
    ids = submit(database_url, ["mlflow"], out, arms=["A"])
    ingest_and_end(database_url, ids, records, end=True)
    forwarder = Forwarder(settings_for(database_url, tmp_path / "home"))
    try:
        forward(forwarder, TrackerName.mlflow)
    finally:
        forwarder.stop()
    run = mlflow_runs()["A"]
    assert run.info.artifact_uri.startswith((store / "mlruns").as_uri() + "/")
    assert [e["kind"] for e in mlflow_events(run.info.run_id)] == ["started", "completed"]
    kept = {p.relative_to(store / "mlruns").parts[-1] for p in (store / "mlruns").rglob("*") if p.is_file()}
    assert {"spec.json", "events.json"} <= kept and any(name.endswith(".png") for name in kept)
    assert not (working / "mlruns").exists() and list(working.iterdir()) == []


def test_mlflow_artifact_root_follows_the_tracking_uri(tmp_path: Path) -> None:
    from orchestrator.trackers.mlflow_sink import artifact_root

    home = tmp_path / "home"
    assert artifact_root(f"sqlite:///{tmp_path}/db/mlflow.db", home) == (tmp_path / "db" / "mlruns").as_uri()
    assert artifact_root("postgresql+psycopg://mlflow@db.lab/mlflow", tmp_path / "home") == (
        tmp_path / "home" / "mlruns").as_uri()  # a database elsewhere: the controller's home, never its cwd
    for own in ("http://mlflow.lab:5000", "https://user:pw@mlflow.lab", (tmp_path / "mlruns").as_uri(),
                str(tmp_path / "mlruns"), "databricks"):
        assert artifact_root(own, tmp_path / "home") is None, own  # the server or file store decides


class BlockedSink:
    """A tracker that hangs until released, then refuses: stands for a tracker server that stopped answering."""

    name = TrackerName.mlflow

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def open(self, run: TrackedRun) -> Opened:
        self.calls += 1
        self.release.wait(60)
        raise ConnectionError("tracker server not answering")

    def checkpoint(self, run_id: int, point: Point) -> None:
        raise AssertionError("never reached: open failed")

    def status(self, run_id: int, status: Status) -> None:
        raise AssertionError("never reached: open failed")

    def close(self, run_id: int) -> None:
        pass


def test_a_hanging_tracker_neither_delays_ingest_nor_touches_the_runs(
    database_url: str, tmp_path: Path, tracker_env: Path, trained: tuple[Path, list[dict[str, Any]]]
) -> None:
    out, records = trained
    ids = submit(database_url, ["mlflow", "tensorboard"], out, arms=["A"])
    sink = BlockedSink()
    forwarder = Forwarder(settings_for(database_url, tmp_path, tracker_retries=2), sinks={TrackerName.mlflow: sink})
    forwarder.start()
    try:
        for i, record in enumerate(records):  # the launcher's path: store, then notify
            ingest_and_end(database_url, ids, [record], end=i == len(records) - 1)
            forwarder.notify(ids[0])
            assert sink.calls <= 1  # the mlflow lane hangs in its first call all along
        # TensorBoard, in a lane of its own, gets everything while MLflow hangs.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(tensorboard_runs(tmp_path / "tensorboard")) == 0:
            time.sleep(0.2)
        wait_closed(database_url, ids[0], "tensorboard")
        sink.release.set()
        outage = wait_event(database_url, ids[0], "tracker")
    finally:
        forwarder.stop()
    assert outage.message.startswith("tracker mlflow: unreachable, 2 retries") and "not answering" in outage.message
    with session_scope(database_url) as session:
        run = session.get_one(Run, ids[0])
        assert (run.state, run.error, run.last_checkpoint_step) == ("completed", None, records[-1]["step"])
        assert session.scalars(select(Metric.step).where(Metric.run_id == ids[0])).all() == [r["step"] for r in records]
        cursor = session.scalar(select(TrackerRun).where(TrackerRun.run_id == ids[0], TrackerRun.tracker == "mlflow"))
        assert (cursor.step, cursor.closed, cursor.failures) == (None, False, 1)  # all still due for when it answers


def test_an_unreachable_mlflow_server_is_recorded_on_the_run_once_and_caught_up_later(
    database_url: str, tmp_path: Path, tracker_env: Path, trained: tuple[Path, list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out, records = trained
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there: connections are refused at once
    monkeypatch.setenv("MLFLOW_TRACKING_URI", dead)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    ids = submit(database_url, ["mlflow"], out, arms=["A"])
    ingest_and_end(database_url, ids, records, end=True)
    forwarder = Forwarder(settings_for(database_url, tmp_path, tracker_retries=3, tracker_backoff_max_s=0.01))
    for _ in range(3):
        forward(forwarder, TrackerName.mlflow)
        time.sleep(0.02)
    outages = events(database_url, ids[0], "tracker")
    assert len(outages) == 1 and outages[0].message.startswith("tracker mlflow: unreachable, 3 retries")
    # The server is back (a file store here): everything goes out once, and the run says so.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    forwarder.lanes[TrackerName.mlflow].sink = None  # the client is built again, as after a restart
    forward(forwarder, TrackerName.mlflow)
    forwarder.stop()
    assert "forwarding again" in events(database_url, ids[0], "tracker")[-1].message
    from mlflow.tracking import MlflowClient

    run = mlflow_runs()["A"]
    assert [m.step for m in MlflowClient().get_metric_history(run.info.run_id, "val_flow_loss")] == [10, 20, 30]


# -- helpers ----------------------------------------------------------------------------------------


def events(database_url: str, run_id: int, kind: str) -> list[Event]:
    with session_scope(database_url) as session:
        return list(session.scalars(select(Event).where(Event.run_id == run_id, Event.kind == kind).order_by(Event.id)))


def wait_event(database_url: str, run_id: int, kind: str) -> Event:
    return wait_for(lambda: (events(database_url, run_id, kind) or [None])[0], f"a {kind} event on run {run_id}")
