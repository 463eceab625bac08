"""What a node wrote reaches the trackers only within bounds, one run's bad file stops no other run, and no
secret leaves through a tracker: real TensorBoard event files, a W&B offline run, an MLflow file store, a
real migrated database, records and sample images from real tiny training on CPU."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from sqlalchemy import select, update

from orchestrator.db.events import record_event
from orchestrator.db.models import Event, Grid, TrackerRun
from orchestrator.db.session import session_scope
from orchestrator.grids.arms import resolve
from orchestrator.grids.service import GridCreate, PathPolicy, create_grid
from orchestrator.runs.ingest import ingest
from orchestrator.settings import Settings
from orchestrator.trackers.forwarder import Forwarder
from orchestrator.vocabulary import RunState, TrackerName
from tests.kit.net import free_port
from tests.kit.settings import tiny_overrides
from tests.orchestrator.trackers.tracker_files import (
    mlflow_runs,
    settings_for,
    tb_text,
    tensorboard_runs,
    wandb_runs,
)
from worker.run_files import sample_dir
from worker.train import train_arm

TINY = tiny_overrides(30)
LAST = 30  # the tiny run's last checkpoint step


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """One tiny arm's real run folder and records (checkpoints 10, 20, 30, with 32x32 sample images)."""
    out = tmp_path_factory.mktemp("run")
    return out, list(train_arm(resolve("A", TINY), out))


@pytest.fixture
def run_folder(tmp_path: Path, trained: tuple[Path, list[dict[str, Any]]]) -> Path:
    """A copy of the trained folder that a test may write hostile samples into."""
    return Path(shutil.copytree(trained[0], tmp_path / "node-run"))


@pytest.fixture(autouse=True)
def alone(database_url: str) -> Iterator[None]:
    """The module shares one database: a test's grids forward nowhere once it is over."""
    yield
    with session_scope(database_url) as session:
        session.execute(update(Grid).values(trackers=[]))


def running_grid(database_url: str, trackers: list[str], folder: Path, records: list[dict[str, Any]],
                 arms: list[Any] | None = None) -> list[int]:  # fmt: skip
    """A grid naming `trackers` whose runs ran from `folder` and ended with `records` stored."""
    with session_scope(database_url) as session:
        grid = create_grid(session, GridCreate(name="hostile", arms=arms or ["A"], overrides=TINY, trackers=trackers))
        for run in grid.runs:
            run.state, run.checkpoint_dir = RunState.running, str(folder)
            record_event(session, run, "started", "on node local")
            ingest(session, run, records)
            run.state = RunState.completed
            record_event(session, run, "completed", f"ended at step {run.last_checkpoint_step}")
        return [r.id for r in grid.runs]


def events(database_url: str, run_id: int, kind: str = "tracker") -> list[str]:
    with session_scope(database_url) as session:
        return list(session.scalars(select(Event.message).where(Event.run_id == run_id, Event.kind == kind)
                                    .order_by(Event.id)))  # fmt: skip


def cursor_step(database_url: str, run_id: int, tracker: str) -> int | None:
    with session_scope(database_url) as session:
        return session.scalar(select(TrackerRun.step).where(TrackerRun.run_id == run_id, TrackerRun.tracker == tracker))


def blank_png(path: Path, side: int) -> None:
    """An all-black `side` x `side` PNG: a few KB on disk, side * side * 3 bytes once decoded to RGB."""
    Image.new("1", (side, side)).save(path, format="PNG", optimize=True)


def forward_all(settings: Settings, *names: TrackerName) -> None:
    forwarder = Forwarder(settings)
    try:
        for name in names:
            forwarder.forward(name)
    finally:
        forwarder.stop()


# -- finding 1: images are bounded before anything decodes them -------------------------------------------


def test_an_oversized_sample_is_refused_by_its_header_and_named_and_the_checkpoint_still_goes_out(
    database_url: str, tmp_path: Path, tracker_env: Path, run_folder: Path,
    trained: tuple[Path, list[dict[str, Any]]],
) -> None:
    _, records = trained
    bomb = run_folder / sample_dir(LAST) / "recon_0.png"
    blank_png(bomb, 8000)  # 8000x8000: a few KB, a check_png pass, 192 MB of RGB once decoded
    assert bomb.stat().st_size < 64 << 10
    ids = running_grid(database_url, ["tensorboard", "mlflow", "wandb"], run_folder, records)
    forward_all(settings_for(database_url, tmp_path), *TrackerName)

    refusals = events(database_url, ids[0])
    assert len(refusals) == 3, refusals  # one per tracker lane, each naming the file and why
    for tracker, message in zip(sorted(TrackerName), sorted(refusals), strict=True):
        assert message.startswith(f"tracker {tracker}: step {LAST}: left out")
        assert f"{sample_dir(LAST)}/recon_0.png (" in message and "8000x8000 pixels, over" in message
    for tracker in TrackerName:
        assert cursor_step(database_url, ids[0], tracker) == LAST  # the checkpoint went out without it

    (acc,) = tensorboard_runs(tmp_path / "tensorboard").values()
    assert [e.step for e in acc.Images("samples/recon_0")] == [10, 20]
    assert [e.step for e in acc.Images("samples/recon_1")] == [10, 20, LAST]
    from mlflow.tracking import MlflowClient

    run = mlflow_runs()["A"]
    stored = {Path(f.path).name for f in MlflowClient().list_artifacts(run.info.run_id, f"samples/step_{LAST:07d}")}
    assert "recon_1.png" in stored and "recon_0.png" not in stored
    ((wb,),) = wandb_runs(tmp_path / "wandb").values()
    last = next(row for row in wb.history if row["_step"] == LAST)
    assert "samples/recon_1" in last and "samples/recon_0" not in last
    media = tmp_path / "wandb"  # W&B copied each PNG it was given into the run's media before the file went
    assert (len(list(media.rglob("media/images/samples/recon_1_*.png"))),
            len(list(media.rglob("media/images/samples/recon_0_*.png")))) == (3, 2)  # fmt: skip


def test_a_checkpoint_forwards_each_sample_once_and_at_most_64(
    database_url: str, tmp_path: Path, tracker_env: Path, run_folder: Path,
    trained: tuple[Path, list[dict[str, Any]]],
) -> None:
    _, records = trained
    folder = run_folder / sample_dir(LAST)
    for i in range(2, 100):  # 98 more real 32x32 images, beside the trainer's own
        shutil.copy(folder / "text_0.png", folder / f"text_{i}.png")
    last = dict(records[-1])
    listed = last["samples"]["files"]
    # The manifest a node may send: every image twice, then 6 kinds x 1000 names (most of them absent).
    extra = [{"file": f"{kind}_{i}.png", "kind": kind, "index": i, "caption": "x"}
             for kind in ("target", "recon", "text", "caption", "edit", "own") for i in range(1000)]  # fmt: skip
    last["samples"] = {**last["samples"], "files": listed + listed + extra}
    ids = running_grid(database_url, ["tensorboard"], run_folder, [*records[:-1], last])
    forward_all(settings_for(database_url, tmp_path), TrackerName.tensorboard)

    (acc,) = tensorboard_runs(tmp_path / "tensorboard").values()
    at_last = [tag for tag in acc.Tags()["images"] if any(e.step == LAST for e in acc.Images(tag))]
    assert len(at_last) == 64
    assert [e.step for e in acc.Images("samples/recon_0")] == [10, 20, LAST]  # once per step, not twice
    (refusal,) = events(database_url, ids[0])
    assert refusal.startswith(f"tracker tensorboard: step {LAST}: left out")
    assert "over 64 images a checkpoint" in refusal


# -- finding 3: one run's bad file is that run's refusal; every other run forwards ---------------------------


def test_a_non_png_sample_is_a_refusal_on_its_run_and_every_other_run_and_grid_forwards(
    database_url: str, tmp_path: Path, tracker_env: Path, run_folder: Path,
    trained: tuple[Path, list[dict[str, Any]]],
) -> None:
    good, records = trained
    (run_folder / sample_dir(20) / "target_0.png").write_bytes(b"GIF89a, named .png by a node")
    hostile = running_grid(database_url, ["tensorboard"], run_folder, records)
    others = running_grid(database_url, ["tensorboard"], good, records, arms=["A", "B"])
    forward_all(settings_for(database_url, tmp_path), TrackerName.tensorboard)

    (refusal,) = events(database_url, hostile[0])
    assert refusal.startswith("tracker tensorboard: step 20: left out 1 sample image(s)")
    assert f"{sample_dir(20)}/target_0.png of run {hostile[0]} is not a PNG" in refusal
    for run_id in hostile + others:
        assert cursor_step(database_url, run_id, "tensorboard") == LAST
    arms = [acc for grid in sorted((tmp_path / "tensorboard").iterdir()) for acc in tensorboard_runs(grid).values()]
    assert len(arms) == 3 and all([e.step for e in acc.Scalars("val_flow_loss")] == [10, 20, LAST] for acc in arms)


def test_a_record_a_lane_cannot_read_is_that_checkpoint_s_refusal_and_the_run_goes_on(
    database_url: str, tmp_path: Path, tracker_env: Path, trained: tuple[Path, list[dict[str, Any]]],
) -> None:
    out, records = trained
    # An integer past any float (JSON allows it), from an arm whose detector is off (so nothing else reads
    # it as a number): it cannot be a tracker's scalar.
    huge = [{**r, "tokens_seen": 10**400} if r["step"] == 20 else r for r in records]
    off = {"parent": "A", "name": "A-off", "detector": {"mode": "off"}}
    hostile = running_grid(database_url, ["tensorboard"], out, huge, arms=[off])
    others = running_grid(database_url, ["tensorboard"], out, records)
    forward_all(settings_for(database_url, tmp_path), TrackerName.tensorboard)

    (refusal,) = events(database_url, hostile[0])
    assert refusal.startswith("tracker tensorboard: step 20: not forwarded: OverflowError")
    for run_id in hostile + others:
        assert cursor_step(database_url, run_id, "tensorboard") == LAST
    steps = {grid.name: [e.step for acc in tensorboard_runs(grid).values() for e in acc.Scalars("val_flow_loss")]
             for grid in (tmp_path / "tensorboard").iterdir()}  # fmt: skip
    assert sorted(steps.values()) == [[10, 20, LAST], [10, LAST]]


def test_a_run_whose_stored_rows_break_its_reading_is_paused_alone_and_the_pass_goes_on(
    database_url: str, tmp_path: Path, tracker_env: Path, trained: tuple[Path, list[dict[str, Any]]],
) -> None:
    from orchestrator.db.models import Metric
    from orchestrator.runs.ingest import metric_series

    out, records = trained
    bad = running_grid(database_url, ["tensorboard"], out, records)  # the lowest id: the pass meets it first
    others = running_grid(database_url, ["tensorboard"], out, records, arms=["A", "B"])
    with session_scope(database_url) as session:  # a row stored before records were checked by shape
        row = session.scalars(select(Metric).where(Metric.run_id == bad[0], Metric.step == 20)).one()
        row.extra = {**(row.extra or {}), "nonfinite": "x"}
    with session_scope(database_url) as session:
        try:
            metric_series(session, bad[0])
            breaks = False
        except Exception:  # noqa: BLE001 - whether today's reader of stored rows still trips on it
            breaks = True
    forward_all(settings_for(database_url, tmp_path), TrackerName.tensorboard)

    for run_id in others:
        assert cursor_step(database_url, run_id, "tensorboard") == LAST
    if breaks:  # recorded on that run, once, and paused like an outage
        (failure,) = events(database_url, bad[0])
        assert failure.startswith(f"tracker tensorboard: could not forward run {bad[0]}: ")
    else:
        assert cursor_step(database_url, bad[0], "tensorboard") == LAST


# -- finding 4 and the MLflow password: no secret leaves through a tracker -----------------------------------


def test_a_command_arm_s_env_values_reach_no_tracker(
    database_url: str, tmp_path: Path, tracker_env: Path
) -> None:
    secret = "wandb-key-0123456789abcdef"
    arm = {"name": "mine", "code": str(tmp_path), "command": ["python", "train.py"], "env": {"WANDB_API_KEY": secret},
           "detector": {"metric": "val_loss"}}  # fmt: skip
    with session_scope(database_url) as session:
        grid = create_grid(session, GridCreate(name="secret", arms=[arm], trackers=["tensorboard", "mlflow", "wandb"]),
                           paths=PathPolicy(allow_commands=True, command_dirs=[tmp_path]))  # fmt: skip
        (run,) = grid.runs
        run.state = RunState.running
        record_event(session, run, "started", "on node local")
    forward_all(settings_for(database_url, tmp_path), *TrackerName)

    (acc,) = tensorboard_runs(tmp_path / "tensorboard").values()
    ((_, spec_text),) = tb_text(acc, "spec")
    assert secret not in spec_text and '"WANDB_API_KEY": "<hidden>"' in spec_text
    from mlflow.tracking import MlflowClient

    mlflow_run = mlflow_runs()["mine"]
    assert mlflow_run.data.params["command.env.WANDB_API_KEY"] == "<hidden>"
    assert secret not in str(mlflow_run.data.params)
    spec_json = MlflowClient().download_artifacts(mlflow_run.info.run_id, "spec.json", str(tmp_path / "dl"))
    assert secret not in Path(spec_json).read_text() and "<hidden>" in Path(spec_json).read_text()
    ((wb,),) = wandb_runs(tmp_path / "wandb").values()
    assert wb.config["command"]["env"] == {"WANDB_API_KEY": "<hidden>"}
    assert not [p for p in (tmp_path / "wandb").rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_a_failing_mlflow_lane_names_the_server_without_its_password(
    database_url: str, tmp_path: Path, tracker_env: Path, trained: tuple[Path, list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    out, records = trained
    password = "tracking-pass-9f8e7d"
    port = free_port()  # nothing listens there: connections are refused at once
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://ablate:{password}@127.0.0.1:{port}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    ids = running_grid(database_url, ["mlflow"], out, records)
    caplog.set_level(logging.DEBUG, logger="ablate")
    forward_all(settings_for(database_url, tmp_path, tracker_retries=2, tracker_backoff_max_s=0.01), TrackerName.mlflow)

    (outage,) = events(database_url, ids[0])
    assert outage.startswith("tracker mlflow: unreachable, 2 retries")
    assert f"ablate:***@127.0.0.1:{port}" in outage and password not in outage
    with session_scope(database_url) as session:
        cursor = session.scalar(select(TrackerRun).where(TrackerRun.run_id == ids[0]))
        assert cursor.last_error is not None and password not in cursor.last_error
    assert caplog.records and not [r for r in caplog.records if password in r.getMessage()]
