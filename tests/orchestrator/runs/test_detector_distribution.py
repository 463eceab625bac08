"""A distribution metric (CMMD, DINO-MMD, FD-DINOv2) as the detector's metric: measured only every k-th
checkpoint, judged where measured; a stand-in extractor's collapse is a warning, never a stop. Replayed on
exact decision sequences, and through the controller's ingest on a real database."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from sqlalchemy import select

from model.spec import ArmSpec, DetectorPolicy
from orchestrator.db.models import Event, Run
from orchestrator.db.session import session_scope
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.runs.detector import Checkpoint, decide
from orchestrator.runs.ingest import ingest
from orchestrator.vocabulary import RunState

REAL = "clip-vit-l-14-336"
STANDIN = "clip-vit-l-14-336 (random stand-in)"
# CMMD measured at every 2nd checkpoint (steps 100, 300, ...): best 1.20 @500, then 1.45 and 1.80, each worse
# by far more than 2 SE (0.02). Values above 1: LPIPS's ceiling of 1.0 must not apply to CMMD's scale.
CMMD = {100: 2.00, 300: 1.50, 500: 1.20, 700: 1.45, 900: 1.80}


def _record(step: int, extractor: str) -> dict:
    """A checkpoint of a run that judges CMMD: the flow loss every time, CMMD on the pass's checkpoints."""
    record = {"step": step, "train_loss": 0.5, "val_flow_loss": 0.4, "val_flow_loss_se": 0.01,
              "checkpoint": f"/ckpt/{step}.pt"}  # fmt: skip
    if step in CMMD:
        record |= {"cmmd": CMMD[step], "cmmd_se": 0.02, "cmmd_n": 32, "cmmd_extractor": extractor,
                   "cmmd_samples": [CMMD[step]] * 32, "distribution_seconds": 3.5}  # fmt: skip
    return record


def _records(extractor: str) -> list[dict]:
    return [_record(step, extractor) for step in range(100, 1000, 100)]


POLICY = DetectorPolicy(metric="cmmd")


def _decisions(extractor: str) -> list[tuple[str, bool, tuple[str, ...]]]:
    series = [Checkpoint.from_mapping(r) for r in _records(extractor)]
    return [(d.kind.value, d.stop, d.warnings) for d in (decide(series[: i + 1], POLICY) for i in range(len(series)))]


def test_a_cmmd_collapse_stops_at_its_second_worse_measured_checkpoint_and_gaps_are_no_warning() -> None:
    decisions = _decisions(REAL)
    # steps 100..800 continue with no warning (the unmeasured ones too); 900 is the second worse measured one
    assert decisions[:-1] == [("continue", False, ())] * 8
    assert decisions[-1][:2] == ("collapse", True)
    series = [Checkpoint.from_mapping(r) for r in _records(REAL)]
    last = decide(series, POLICY)
    assert (last.best_step, last.best_value) == (500, 1.20)
    assert "cmmd worsened 2 checkpoints in a row" in last.reason and "cmmd_se" in last.reason
    assert decide(series[:2], POLICY).reason == "cmmd not measured at step 200: judged where measured"


def test_a_standin_extractors_collapse_is_a_warning_and_never_stops() -> None:
    decisions = _decisions(STANDIN)
    assert [k for k, _, _ in decisions] == ["continue"] * 9 and not any(stop for _, stop, _ in decisions)
    (warning,) = decisions[-1][2]
    assert "cmmd worsened 2 checkpoints" in warning and "stand-in extractor: a warning only" in warning


def test_a_detector_metric_must_be_measured_and_may_not_be_descriptive() -> None:
    with pytest.raises(ValidationError, match=r"detector.metric 'cmmd' is not measured: add it to eval.distribution"):
        ArmSpec.model_validate({"detector": {"metric": "cmmd"}})
    with pytest.raises(ValidationError, match=r"fid is not offered"):  # refused at eval.distribution.metrics
        ArmSpec.model_validate({"detector": {"metric": "fid"},
                                "eval": {"distribution": {"metrics": ["fid"], "samples": 32}}})  # fmt: skip
    spec = ArmSpec.model_validate({"detector": {"metric": "fd_dinov2"},
                                   "eval": {"distribution": {"metrics": ["fd_dinov2"], "samples": 32}}})  # fmt: skip
    assert spec.detector.metric == "fd_dinov2"


def _arm(name: str) -> dict:
    return {"parent": "A", "name": name, "detector": {"metric": "cmmd"},
            "eval": {"distribution": {"metrics": ["cmmd"], "samples": 32}}}  # fmt: skip


def test_ingest_stops_a_run_on_a_cmmd_collapse_but_not_on_a_standins(database_url: str) -> None:
    with session_scope(database_url) as session:
        grid = create_grid(session, GridCreate(name="cmmd judges", arms=[_arm("real"), _arm("standin")]))
        for run in grid.runs:
            run.state = RunState.running
        real_id, standin_id = (r.id for r in grid.runs)
    for run_id, extractor in ((real_id, REAL), (standin_id, STANDIN)):
        for record in _records(extractor):  # one reply per checkpoint, as a worker streams them
            with session_scope(database_url) as session:
                ingest(session, session.get_one(Run, run_id), [record])
    with session_scope(database_url) as session:
        real, standin = session.get_one(Run, real_id), session.get_one(Run, standin_id)
        assert (real.decision, real.decision_step) == ("collapse", 900)
        assert (real.best_step, real.best_value, real.best_checkpoint) == (500, 1.20, "/ckpt/500.pt")
        assert "cmmd worsened 2 checkpoints" in real.decision_reason
        assert standin.decision is None and (standin.best_step, standin.best_value) == (500, 1.20)
        warnings = session.scalars(select(Event.message).where(Event.run_id == real_id, Event.kind == "warning")).all()
        assert warnings == [], "a checkpoint the pass skipped is no warning"
        (standin_warning,) = session.scalars(
            select(Event.message).where(Event.run_id == standin_id, Event.kind == "warning")
        ).all()
        assert "random stand-in extractor" in standin_warning


def test_a_distribution_value_outside_its_range_is_refused_and_the_per_sample_values_take_the_mmds() -> None:
    from orchestrator.runs.ingest import refused_metrics

    assert refused_metrics(_records(REAL)) is None
    assert "cmmd 6000 is outside its range" in refused_metrics([_record(100, REAL) | {"cmmd": 6000.0}])
    assert "cmmd_samples holding" in refused_metrics([_record(100, REAL) | {"cmmd_samples": [1.0, -9000.0]}])
    assert "distribution_seconds -1" in refused_metrics([_record(100, REAL) | {"distribution_seconds": -1.0}])
    assert refused_metrics([_record(100, REAL) | {"fd_dinov2": -1e-9, "fd_dinov2_se": 0.3}]) is None  # round-off
