"""A grid's verdict where the researcher looks: the report's effects table (each comparison's difference,
95% interval, seeds, images, decision and what the interval covers) reaches every tracker the grid names,
read back from each tracker's own files: the summary table `effects` of every W&B run of the grid (offline),
the MLflow parent run's effects.json and tags (a file store), TensorBoard's text `effects` in the grid's folder.
A fixed grid's goes out when its report is written; a deciding grid's after each look, then with the report.

The records are one real tiny run's, shifted per arm, seed and image by known amounts, so the effect the
trackers show is known: B - A = 0.01 + 0.002 x (mean seed index) on every metric with per-image values."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from orchestrator.db.events import record_event
from orchestrator.db.models import Event, Grid, Run, TrackerRun
from orchestrator.db.session import session_scope
from orchestrator.grids.arms import resolve
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.results.deciding.decider import decide_due_grids
from orchestrator.results.deciding.decisions import grid_looks
from orchestrator.results.reports.write import ReportWriter, report_dir
from orchestrator.runs.ingest import ingest
from orchestrator.trackers.forwarder import Forwarder
from orchestrator.vocabulary import RunState, TrackerName
from tests.kit.net import free_port
from tests.kit.settings import tiny_overrides
from tests.orchestrator.trackers.tracker_files import mlflow_runs, settings_for, tb_text, tensorboard_runs, wandb_runs
from worker.train import train_arm

TINY = tiny_overrides(20)
ARMS = ["A", {"parent": "A", "name": "B", "schedule": {"lr": 3.03e-4}}]
ALL = ["tensorboard", "mlflow", "wandb"]
# the issue's, the look's reason for the decision, then what the interval covers
COLUMNS = ("arm", "vs", "metric", "diff", "low", "high", "k", "n", "decision", "reason", "covers")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("run")
    return out, list(train_arm(resolve("A", TINY), out))


def shifted(records: list[dict[str, Any]], arm: str, seed: int) -> list[dict[str, Any]]:
    """The records with B's per-image values raised by 0.01 + 0.002 x seed, +-0.001 image by image (mean 0
    over an even number of images): a known effect with seed and image noise in it."""
    out = []
    for r in records:
        r = dict(r)
        for key in [k for k in r if k.endswith("_samples") and isinstance(r[k], list)]:
            metric = key.removesuffix("_samples")
            shift = [(0.01 + 0.002 * seed + 0.001 * (1 if i % 2 else -1)) if arm == "B" else 0.0
                     for i in range(len(r[key]))]  # fmt: skip
            r[key] = [x + d for x, d in zip(r[key], shift, strict=True)]
            r[metric] = sum(r[key]) / len(r[key])
        out.append(r)
    return out


def run_wave(database_url: str, grid_id: int, out: Path, records: list[dict[str, Any]]) -> None:
    """Every queued run of the grid runs to its end here, storing its shifted records, as a launcher would."""
    with session_scope(database_url) as session:
        for run in session.scalars(select(Run).where(Run.grid_id == grid_id, Run.state == RunState.queued)):
            run.state, run.checkpoint_dir = RunState.running, str(out)
            record_event(session, run, "started", "on node local")
            ingest(session, run, shifted(records, run.arm, run.seed))
            run.state = RunState.completed
            record_event(session, run, run.state, f"ended at step {run.last_checkpoint_step}")


def forward(forwarder: Forwarder, trackers: list[str]) -> None:
    for name in trackers:
        forwarder.forward(TrackerName(name))


def report_rows(settings: Any, grid_id: int) -> list[dict[str, Any]]:  # noqa: ANN401 - Settings
    """The written report's effects, as the trackers' columns."""
    report = json.loads((report_dir(settings, grid_id) / "report.json").read_text())
    return [{"arm": e["arm"], "vs": f"{e['other_arm']} ({e['against']})", "metric": e["metric"], "diff": e["diff"],
             "low": e["low"], "high": e["high"], "k": e["k"], "n": e["n"],
             "decision": e["decision"] or ("stand-in: no verdict" if e["standin"] else
                                           f"descriptive: {e['reading']}" if e["descriptive"] else e["reading"]),
             "reason": e["decision_reason"] or "", "covers": e["noise"]} for e in report["effects"]]  # fmt: skip


def same_rows(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> bool:
    assert [(r["arm"], r["vs"], r["metric"]) for r in got] == [(r["arm"], r["vs"], r["metric"]) for r in want]
    for g, w in zip(got, want, strict=True):
        for column in COLUMNS:
            assert g[column] == (pytest.approx(w[column]) if isinstance(w[column], float) else w[column]), column
    return True


def wandb_tables(root: Path) -> dict[str, list[tuple[str, list[dict[str, Any]]]]]:
    """W&B run name -> (effects_at, the effects table's rows) of each part of the run that holds one."""
    out: dict[str, list[tuple[str, list[dict[str, Any]]]]] = {}
    for name, parts in wandb_runs(root).items():
        for part in parts:
            table = part.summary.get("effects")
            if table is None:
                continue
            assert table["_type"] == "table-file"
            data = json.loads((part.path.parent / "files" / table["path"]).read_text())
            assert tuple(data["columns"]) == COLUMNS
            out.setdefault(name, []).append((part.summary["effects_at"], [dict(zip(COLUMNS, row, strict=True))
                                                                          for row in data["data"]]))  # fmt: skip
    return out


def mlflow_effects(run_id: str) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient

    with tempfile.TemporaryDirectory() as folder:
        return json.loads(Path(MlflowClient().download_artifacts(run_id, "effects.json", folder)).read_text())


def effects_events(database_url: str, grid_id: int) -> list[Event]:
    with session_scope(database_url) as session:
        rows = session.scalars(select(Event).where(Event.grid_id == grid_id, Event.run_id.is_(None),
                                                   Event.kind.in_(("effects", "tracker"))).order_by(Event.id))
        return list(rows)


def test_a_fixed_grids_effects_reach_all_three_trackers_with_the_report(
    database_url: str, tmp_path: Path, tracker_env: Path, trained: tuple[Path, list[dict[str, Any]]]
) -> None:
    out, records = trained
    settings = settings_for(database_url, tmp_path)
    with session_scope(database_url) as session:
        grid_id = create_grid(session, GridCreate(name="verdict grid", arms=ARMS, seeds=2, overrides=TINY,
                                                  trackers=ALL)).id  # fmt: skip
    run_wave(database_url, grid_id, out, records)
    forwarder = Forwarder(settings)
    try:
        forward(forwarder, ALL)  # the runs' points and ends: no table yet, the report is not written
        assert effects_events(database_url, grid_id) == []
        ReportWriter(settings).housekeeping()
        forward(forwarder, ALL)
        forward(forwarder, ALL)  # nothing new: the table is not sent twice
    finally:
        forwarder.stop()
    want = report_rows(settings, grid_id)
    # The known effect: B - A = 0.01 + 0.002 x 0.5 on the flow loss, across 2 seeds and the held-out images.
    flow = {r["metric"]: r for r in want if r["arm"] == "B" and r["vs"] == "A (parent)"}
    assert flow["val_flow_loss"]["diff"] == pytest.approx(0.011) and flow["val_flow_loss"]["k"] == 2
    assert flow["val_flow_loss"]["low"] < 0.011 < flow["val_flow_loss"]["high"]
    assert flow["val_flow_loss"]["covers"].startswith("training seeds (k=2) and evaluation images (n=2), crossed")
    assert flow["recon_lpips"]["decision"] == "stand-in: no verdict"

    wb = wandb_tables(tmp_path / "wandb")  # every run of the grid, once each
    assert sorted(wb) == ["A-s0", "A-s1", "B-s0", "B-s1"]
    for parts in wb.values():
        assert len(parts) == 1 and parts[0][0] == "final report" and same_rows(parts[0][1], want)
    runs = mlflow_runs()
    parent = runs["verdict grid"]
    doc = mlflow_effects(parent.info.run_id)
    assert doc["at"] == "final report" and tuple(doc["columns"]) == COLUMNS and same_rows(doc["rows"], want)
    tag = parent.data.tags["ablate.effect.B.vs.A.parent.val_flow_loss"]
    assert tag.startswith("+0.011 [") and tag.endswith("(k=2, n=2)")
    assert parent.data.tags["ablate.effects_at"] == "final report"
    tb = tensorboard_runs(tmp_path / "tensorboard")
    ((step, text),) = tb_text(tb[f"grid-{grid_id}-verdict-grid"], "effects")
    assert step == 0 and text.startswith("effects, final report")
    assert "| B | A (parent) | val_flow_loss | +0.011 |" in text
    with session_scope(database_url) as session:
        cursors = session.scalars(select(TrackerRun).where(TrackerRun.grid_id == grid_id, TrackerRun.run_id.is_(None)))
        (table,) = [e for e in effects_events(database_url, grid_id) if e.kind == "effects"]
        assert {(c.tracker, c.event_id) for c in cursors} == {(t, table.id) for t in ALL}


def test_a_deciding_grids_trackers_see_each_look_then_the_final_report(
    database_url: str, tmp_path: Path, tracker_env: Path, trained: tuple[Path, list[dict[str, Any]]]
) -> None:
    """At an alpha no tiny run meets, with futility off: look 1 leaves B vs A open and adds a seed, look 2
    is at max_seeds and closes it undecided."""
    out, records = trained
    settings = settings_for(database_url, tmp_path)
    decide = {"alpha": 1e-9, "min_seeds": 2, "max_seeds": 3, "futility": 0}
    with session_scope(database_url) as session:
        grid_id = create_grid(session, GridCreate(name="deciding", arms=ARMS, overrides=TINY, decide=decide,
                                                  trackers=ALL)).id  # fmt: skip
    forwarder = Forwarder(settings)
    try:
        for _ in range(2):  # two waves, each followed by its look
            run_wave(database_url, grid_id, out, records)
            forward(forwarder, ALL)
            decide_due_grids(settings)
            ReportWriter(settings).housekeeping()
            forward(forwarder, ALL)
    finally:
        forwarder.stop()
    tables = [e for e in effects_events(database_url, grid_id) if e.kind == "effects"]
    assert [(e.data["look"], e.data["final"]) for e in tables] == [(1, False), (2, True)]
    decided = [[(r["k"], r["decision"]) for r in e.data["rows"] if r["metric"] == "val_flow_ivw"] for e in tables]
    assert decided == [[(2, "open")], [(3, "undecided")]]
    want = report_rows(settings, grid_id)
    assert [(r["k"], r["decision"]) for r in want if r["metric"] == "val_flow_ivw"] == [(3, "undecided")]

    tb = tensorboard_runs(tmp_path / "tensorboard")
    texts = tb_text(tb[f"grid-{grid_id}-deciding"], "effects")
    assert [(step, text.splitlines()[0]) for step, text in texts] == [
        (1, "effects, look 1"), (2, "effects, final report (look 2)")]
    assert "| B | A (parent) | val_flow_ivw |" in texts[0][1] and "| open |" in texts[0][1]
    # Each look's reason travels with its decision: the stored look's words, in every tracker's table.
    reasons = [[r["reason"] for r in e.data["rows"] if r["metric"] == "val_flow_ivw"] for e in tables]
    assert all(len(r) == 1 and r[0] for r in reasons), reasons
    with session_scope(database_url) as session:
        looks = grid_looks(session, grid_id)
        stored = [[c["reason"] for c in look.comparisons if c["metric"] == "val_flow_ivw"] for look in looks]
    assert reasons == stored
    for (_, text), (reason,) in zip(texts, reasons, strict=True):
        assert f"| open | {reason} |" in text or f"| undecided | {reason} |" in text
    parent = mlflow_runs()["deciding"]
    doc = mlflow_effects(parent.info.run_id)
    assert doc["at"] == "final report (look 2)" and same_rows(doc["rows"], want)
    assert parent.data.tags["ablate.effect.B.vs.A.parent.val_flow_ivw"].endswith("undecided (k=3, n=2)")
    wb = wandb_tables(tmp_path / "wandb")
    # The first wave's runs show look 1's table, then the final one; the third seed's runs only the final.
    assert {name: [at for at, _ in parts] for name, parts in wb.items()} == {
        "A-s0": ["look 1", "final report (look 2)"], "A-s1": ["look 1", "final report (look 2)"],
        "A-s2": ["final report (look 2)"], "B-s0": ["look 1", "final report (look 2)"],
        "B-s1": ["look 1", "final report (look 2)"], "B-s2": ["final report (look 2)"]}
    for parts in wb.values():
        assert same_rows(parts[-1][1], want)


def test_a_deciding_grids_mlflow_parent_stays_open_while_a_look_can_add_runs(
    database_url: str, tmp_path: Path, tracker_env: Path, trained: tuple[Path, list[dict[str, Any]]]
) -> None:
    """Between waves every run has ended, yet the next look adds seeds: the parent run stays RUNNING and the
    new seeds' runs open under it; it is FINISHED once the final look ended the decision."""
    out, records = trained
    settings = settings_for(database_url, tmp_path)
    decide = {"alpha": 1e-9, "min_seeds": 2, "max_seeds": 3, "futility": 0}
    with session_scope(database_url) as session:
        grid_id = create_grid(session, GridCreate(name="open parent", arms=ARMS, overrides=TINY, decide=decide,
                                                  trackers=["mlflow"])).id  # fmt: skip
    forwarder = Forwarder(settings)
    try:
        run_wave(database_url, grid_id, out, records)
        forward(forwarder, ["mlflow"])  # every run of wave 1 ended and finished in MLflow; no look yet
        assert mlflow_runs()["open parent"].info.status == "RUNNING"
        assert decide_due_grids(settings) == [grid_id]  # look 1: B vs A open, a third seed of each queued
        forward(forwarder, ["mlflow"])
        assert mlflow_runs()["open parent"].info.status == "RUNNING"
        run_wave(database_url, grid_id, out, records)
        forward(forwarder, ["mlflow"])
        runs = mlflow_runs()
        parent = runs["open parent"]
        assert parent.info.status == "RUNNING"
        assert {name: r.data.tags["mlflow.parentRunId"] for name, r in runs.items() if name != "open parent"} == {
            arm: parent.info.run_id for arm in ("A-s0", "A-s1", "A-s2", "B-s0", "B-s1", "B-s2")}
        assert decide_due_grids(settings) == [grid_id]  # look 2, at max_seeds: final
        ReportWriter(settings).housekeeping()
        forward(forwarder, ["mlflow"])
    finally:
        forwarder.stop()
    parent = mlflow_runs()["open parent"]
    assert parent.info.status == "FINISHED" and parent.data.tags["ablate.runs"] == "6 completed"
    with session_scope(database_url) as session:
        assert session.scalar(select(TrackerRun.closed).where(TrackerRun.grid_id == grid_id,
                                                              TrackerRun.run_id.is_(None)))  # fmt: skip


def test_a_tracker_that_refuses_the_table_is_named_on_the_grid_once_and_sent_later(
    database_url: str, tmp_path: Path, tracker_env: Path, trained: tuple[Path, list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out, records = trained
    settings = settings_for(database_url, tmp_path, tracker_retries=2, tracker_backoff_max_s=0.01)
    with session_scope(database_url) as session:
        grid_id = create_grid(session, GridCreate(name="late", arms=ARMS, overrides=TINY, trackers=["mlflow"])).id
    run_wave(database_url, grid_id, out, records)
    forwarder = Forwarder(settings)
    try:
        forward(forwarder, ["mlflow"])
        ReportWriter(settings).housekeeping()
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")  # nothing listens there
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        forwarder.lanes[TrackerName.mlflow].sink = None
        for _ in range(3):
            forward(forwarder, ["mlflow"])
            time.sleep(0.02)  # past the pause: each pass tries again
        refused = [e.message for e in effects_events(database_url, grid_id) if e.kind == "tracker"]
        assert len(refused) == 1 and refused[0].startswith("tracker mlflow: the effects table was not sent: tracker "
                                                           "mlflow: unreachable, 2 retries")  # fmt: skip
        monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
        forwarder.lanes[TrackerName.mlflow].sink = None
        time.sleep(0.02)
        forward(forwarder, ["mlflow"])
    finally:
        forwarder.stop()
    assert "effects forwarded again" in effects_events(database_url, grid_id)[-1].message
    with session_scope(database_url) as session:
        grid = session.get_one(Grid, grid_id)
        assert grid.trackers == ["mlflow"]
    assert same_rows(mlflow_effects(mlflow_runs()["late"].info.run_id)["rows"], report_rows(settings, grid_id))
