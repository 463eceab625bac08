"""Metric ingest and the detector hook, on a real database (Postgres in CI), without Ray."""

from __future__ import annotations

import math
from collections import Counter

from sqlalchemy import func, select

from orchestrator.db.models import Event, Metric, Run
from orchestrator.db.session import session_scope
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.runs.ingest import ingest, metric_series, refused_metrics
from orchestrator.vocabulary import RunState


def _grid(database_url: str, arms: list, **kw) -> list[int]:
    with session_scope(database_url) as session:
        grid = create_grid(session, GridCreate(name="ingest", arms=arms, **kw))
        for run in grid.runs:
            run.state = RunState.running
        return [r.id for r in grid.runs]


def _record(step: int, lpips: float, **extra) -> dict:
    """A checkpoint with real LPIPS (the detector judges recon_lpips on it)."""
    return {"step": step, "recon_lpips": lpips, "recon_lpips_se": 0.005, "recon_lpips_n": 8,
            "train_loss": 0.5, "checkpoint": f"/ckpt/{step}.pt", "lpips_backbone": "alexnet", **extra}


def test_resent_records_are_stored_once_with_one_event_each(database_url: str) -> None:
    (run_id,) = _grid(database_url, ["A"])
    records = [_record(s, 0.9 - s / 1000) for s in (50, 100, 150)]
    with session_scope(database_url) as session:
        run = session.get(Run, run_id)
        assert ingest(session, run, records[:2]) == [50, 100]
    with session_scope(database_url) as session:  # a restarted controller re-reads the worker's file
        run = session.get(Run, run_id)
        assert ingest(session, run, list(reversed(records))) == [150]
    with session_scope(database_url) as session:
        steps = session.scalars(select(Metric.step).where(Metric.run_id == run_id).order_by(Metric.step)).all()
        events = session.scalar(
            select(func.count()).select_from(Event).where(Event.run_id == run_id, Event.kind == "checkpoint")
        )
        run = session.get(Run, run_id)
        assert steps == [50, 100, 150] and events == 3
        assert (run.last_checkpoint_step, run.best_step, run.best_checkpoint) == (150, 150, "/ckpt/150.pt")
        extra = session.scalar(select(Metric.extra).where(Metric.run_id == run_id, Metric.step == 50))
        assert extra["checkpoint"] == "/ckpt/50.pt" and "recon_lpips" not in extra


def test_nan_loss_survives_storage_and_stops_the_run_as_diverged(database_url: str) -> None:
    (run_id,) = _grid(database_url, ["A"])
    with session_scope(database_url) as session:
        run = session.get(Run, run_id)
        ingest(session, run, [_record(50, 0.8), _record(100, 0.7, train_loss="nan")])
    with session_scope(database_url) as session:
        run = session.get(Run, run_id)
        assert math.isnan(metric_series(session, run_id)[-1]["train_loss"])
        assert (run.decision, run.decision_step, run.best_step) == ("diverged", 100, 100)
        kinds = session.scalars(select(Event.kind).where(Event.run_id == run_id)).all()
        assert kinds.count("decision") == 1


def test_a_value_past_the_overflow_bound_is_stored_as_inf_and_read_as_diverged(database_url: str) -> None:
    """A diverging command arm's lr doubles past 1e30 before its stop lands: that is overflow, not a lie,
    so the reply is stored (not refused) and the value reads as inf, which the detector calls diverged."""
    (run_id,) = _grid(database_url, ["A"])
    records = [_record(50, 0.8), _record(100, 0.7, train_loss=2.5e31, lr=2.5e31)]
    assert refused_metrics(records) is None
    assert "outside its range" in refused_metrics([_record(150, 0.7, train_loss=-2.5e31)])  # a loss is >= 0
    with session_scope(database_url) as session:
        ingest(session, session.get(Run, run_id), records)
    with session_scope(database_url) as session:
        run = session.get(Run, run_id)
        last = metric_series(session, run_id)[-1]
        assert (last["train_loss"], last["lr"]) == (math.inf, math.inf)
        assert (run.decision, run.decision_step) == ("diverged", 100)


def test_collapse_keeps_the_best_checkpoint_and_warn_mode_does_not_stop(database_url: str) -> None:
    stop_id, warn_id = _grid(
        database_url, ["A", {"parent": "A", "name": "A-warn", "detector": {"mode": "warn"}}]
    )
    curve = [0.80, 0.70, 0.60, 0.68, 0.75]  # best @150, then worse twice by more than 0.03 and 2 SE
    for run_id in (stop_id, warn_id):
        with session_scope(database_url) as session:
            run = session.get(Run, run_id)
            ingest(session, run, [_record(50 * (i + 1), v) for i, v in enumerate(curve)])
    with session_scope(database_url) as session:
        stopped, warned = session.get(Run, stop_id), session.get(Run, warn_id)
        assert (stopped.decision, stopped.decision_step) == ("collapse", 250)
        assert (stopped.best_step, stopped.best_value, stopped.best_checkpoint) == (150, 0.6, "/ckpt/150.pt")
        assert "recon_lpips" in stopped.decision_reason
        assert warned.decision == "warn:collapse" and warned.best_step == 150
        kinds = session.scalars(select(Event.kind).where(Event.run_id == warn_id)).all()
        assert "warning" in kinds and "decision" not in kinds


def test_secondary_metric_warnings_are_recorded_while_the_run_goes_on(database_url: str) -> None:
    (run_id,) = _grid(database_url, ["A"])
    # Recon LPIPS keeps improving; text LPIPS worsens from step 150 on by far more than its margin.
    text = [0.90, 0.85, 0.80, 0.90, 1.00]
    records = [_record(50 * (i + 1), 0.8 - 0.02 * i, text_lpips=t) for i, t in enumerate(text)]
    with session_scope(database_url) as session:
        run = session.get(Run, run_id)
        ingest(session, run, records[:3])
    with session_scope(database_url) as session:
        assert session.scalars(select(Event.kind).where(Event.run_id == run_id, Event.kind == "warning")).all() == []
        run = session.get(Run, run_id)
        ingest(session, run, records[3:])
    with session_scope(database_url) as session:
        run = session.get(Run, run_id)
        assert run.decision is None and run.state == RunState.running, "a secondary metric never stops a run"
        warnings = session.scalars(
            select(Event).where(Event.run_id == run_id, Event.kind == "warning").order_by(Event.id)
        ).all()
        assert warnings, "the text_lpips warning is stored while the run goes on"
        assert all("text_lpips" in w.message for w in warnings)
        assert warnings[-1].data["warnings"] and warnings[-1].data["kind"] == "continue"


def test_a_batch_past_the_bind_parameter_limit_is_stored_whole(database_url: str) -> None:
    # One INSERT per poll (a worker that had run ahead) failed past SQLite's variable limit (250000 in
    # Debian's build, 32766 by default), on every launcher pass; chunked inserts store it in one transaction.
    (run_id,) = _grid(database_url, [{"parent": "A", "name": "A", "detector": {"mode": "off"}}])
    records = [_record(s, 0.5) for s in range(1, 12001)]
    with session_scope(database_url) as session:
        assert ingest(session, session.get(Run, run_id), records) == list(range(1, 12001))
    with session_scope(database_url) as session:
        assert session.scalar(select(func.count()).select_from(Metric).where(Metric.run_id == run_id)) == 12000
        assert session.get(Run, run_id).last_checkpoint_step == 12000


def test_under_standin_lpips_the_flow_loss_judges_and_picks_the_best(database_url: str) -> None:
    """Stand-in LPIPS improves throughout while the flow loss collapses: the default policy ("auto")
    stops the run on the flow headline (val_flow_ivw, which the trainer writes beside the plain mean) and
    keeps its best; the same stream with real LPIPS runs on."""
    standin_id, real_id = _grid(database_url, ["A", {"parent": "A", "name": "A-real"}])
    loss = [0.90, 0.60, 0.50, 0.58, 0.70]
    for run_id, backbone in ((standin_id, "random_standin"), (real_id, "alexnet")):
        records = [
            _record(50 * (i + 1), 0.80 - 0.01 * i, lpips_backbone=backbone, val_flow_loss=v, val_flow_loss_se=0.01,
                    val_flow_loss_n=64, val_flow_loss_samples=[v] * 64, val_flow_loss_by_t=[v] * 8,
                    val_flow_ivw=v, val_flow_ivw_se=0.01, val_flow_ivw_n=64)
            for i, v in enumerate(loss)
        ]  # fmt: skip
        with session_scope(database_url) as session:
            ingest(session, session.get(Run, run_id), records)
    with session_scope(database_url) as session:
        standin, real = session.get(Run, standin_id), session.get(Run, real_id)
        assert (standin.decision, standin.decision_step) == ("collapse", 250)
        assert (standin.best_step, standin.best_value) == (150, 0.5)
        assert "val_flow_ivw worsened 2 checkpoints" in standin.decision_reason
        assert real.decision is None and (real.best_step, real.best_value) == (250, 0.76)
        row = session.scalar(select(Metric).where(Metric.run_id == standin_id, Metric.step == 150))
        assert (row.val_flow_loss, row.val_flow_loss_se, row.val_flow_loss_n) == (0.5, 0.01, 64)
        assert row.extra["val_flow_loss_by_t"] == [0.5] * 8 and len(row.extra["val_flow_loss_samples"]) == 64


def test_judging_a_long_reply_costs_linear_time_in_the_series(database_url: str, monkeypatch) -> None:  # noqa: ANN001
    """Every new checkpoint is judged on the series up to it, with the control's for stalls. The detector's
    reads of checkpoint values grow with the series plus the reply, not their product: a node's longest
    reply on a long run cannot hold the launcher up (before, 300 records on a 600-checkpoint run took
    about 300 x 900 x 10 reads)."""
    from orchestrator.runs.detector import Checkpoint

    reads: Counter[str] = Counter()
    get = Checkpoint.get

    def counted(self: Checkpoint, name: str) -> float | None:
        reads["get"] += 1
        return get(self, name)

    control, arm = _grid(database_url, ["A", "B"], overrides={"schedule": {"steps": 10_000}})
    with session_scope(database_url) as session:
        ingest(session, session.get_one(Run, control), [_record(s, 0.5) for s in range(1, 1201)])
        ingest(session, session.get_one(Run, arm), [_record(s, 0.5 + s * 1e-6) for s in range(1, 601)])
    monkeypatch.setattr(Checkpoint, "get", counted)
    with session_scope(database_url) as session:
        new = ingest(session, session.get_one(Run, arm), [_record(s, 0.5) for s in range(601, 901)])
    assert new == list(range(601, 901))
    assert reads["get"] < 40 * (1200 + 900), reads


def test_each_value_of_a_records_lists_is_ranged_and_an_overflow_is_stored_as_inf(database_url: str) -> None:
    """Finding 5 at ingest: a list's values take their metric's range; past the overflow bound a diverging
    arm's per-sample loss is stored as "inf" (text, as the protocol writes it), never as a number."""
    assert "recon_lpips_samples holding recon_lpips 3 is outside its range" in refused_metrics(
        [_record(50, 0.8, recon_lpips_samples=[0.5, 3.0])])
    assert "val_flow_loss_grid holding val_flow_loss -1 is outside" in refused_metrics(
        [_record(50, 0.8, val_flow_loss_grid=[[0.5, -1.0]])])
    assert "integer of 401 digits" in refused_metrics([_record(50, 0.8, val_flow_loss_by_t=[10**400])])
    assert "cmmd_per_reference holding cmmd -9000 is outside its range" in refused_metrics(
        [_record(50, 0.8, cmmd_per_reference=[1.5, -9000.0])])  # an MMD's per-reference values: its range
    flow = {"val_flow_loss_samples": [0.5, 1e200, "nan"], "val_flow_loss_grid": [[0.5, 1e35], [0.4, "inf"]]}
    assert refused_metrics([_record(50, 0.8, **flow)]) is None
    (run_id,) = _grid(database_url, ["A"])
    with session_scope(database_url) as session:
        ingest(session, session.get(Run, run_id), [_record(50, 0.8, **flow)])
    with session_scope(database_url) as session:
        extra = session.scalar(select(Metric.extra).where(Metric.run_id == run_id))
        assert extra["val_flow_loss_samples"] == [0.5, "inf", "nan"]
        assert extra["val_flow_loss_grid"] == [[0.5, "inf"], [0.4, "inf"]]


def test_a_stored_nonfinite_that_ingest_did_not_write_is_ignored_by_the_series(database_url: str) -> None:
    """Finding 6: a node's `nonfinite` (stored before the protocol refused it) put -1e300 into the series,
    and a text one made metric_series raise: from the control, every other arm's ingest failed."""
    control, arm = _grid(database_url, ["A", "B"], control="A")
    with session_scope(database_url) as session:
        run = session.get(Run, control)
        for step, lie in ((50, {"recon_lpips": "-1e300", "train_loss": "nan"}), (100, "x")):
            session.add(Metric(run_id=control, step=step, recon_lpips=0.5, extra={"nonfinite": lie}))
        run.last_checkpoint_step = 100
    with session_scope(database_url) as session:
        series = metric_series(session, control)
        assert [p["recon_lpips"] for p in series] == [0.5, 0.5]  # the lie is not a value
        assert math.isnan(series[0]["train_loss"])  # what ingest itself writes there still reads
        assert ingest(session, session.get(Run, arm), [_record(50, 0.8)]) == [50]  # judged against the control
