"""Issue 63, finding 1, the controller's side: the reference features a distribution value was scored against
are pinned at the first record a trusted node sends for their key; a record naming other features is refused,
nothing stored, and every evaluation job is sent the pins its node must check. On a real database, through the
launcher's EvaluationJobs."""

from __future__ import annotations

import sys
from pathlib import Path

from sqlalchemy import select

from model.spec import ArmSpec
from orchestrator.db.models import Evaluation, Grid, Metric, Run
from orchestrator.db.reference_pin import ReferencePin
from orchestrator.db.session import session_scope
from orchestrator.grids.evaluations import EvaluationCreate, create_evaluation
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.runs.evaluation_jobs import evaluation_args
from orchestrator.runs.launcher import Launcher
from orchestrator.runs.reference_pins import refused_references
from orchestrator.settings import Settings
from tests.kit.polling import wait_for
from tests.kit.readers import run_of
from tests.kit.settings import tiny_overrides
from tests.orchestrator.runs.test_evaluation_refusals import HOSTILE
from tests.orchestrator.runs.test_evaluation_trust import IMAGES, _answer, _grid, _jobs, _record
from worker.reference_keys import reference_key

SAMPLES = 8
# Pins are by key (extractor label and split), and the grids here share one split: each test its own label.
LABEL, OTHER_LABEL, REAL_LABEL = (f"clip-vit-l-14-336{s}" for s in (" small random stand-in (no weights)",
                                                                     " random stand-in (no weights)", ""))
HONEST, FORGED = "a" * 64, "f" * 64  # the features' sha256: the trusted node's, and the stranger's rewrite


def _cmmd(value: float, sha: str, label: str = LABEL) -> dict:
    """A distribution record's fields: CMMD on SAMPLES samples scored against the features of `sha`."""
    per = [value] * SAMPLES
    return {"cmmd": value, "cmmd_se": 0.1, "cmmd_n": SAMPLES, "cmmd_samples": per, "cmmd_extractor": label,
            "distribution_sha256": {label: sha}}  # fmt: skip


def _distribution_evaluation(database_url: str, name: str) -> tuple[int, int]:
    """Grid `name` (tests.orchestrator.runs.test_evaluation_trust's) and an evaluation of CMMD on it."""
    grid_id, _ = _grid(database_url, name)
    with session_scope(database_url) as session:
        grid = session.get_one(Grid, grid_id)
        body = EvaluationCreate(images=IMAGES, samples=SAMPLES, metrics=["cmmd"])
        return grid_id, create_evaluation(session, grid, body).id


def test_a_record_naming_other_reference_features_than_the_pinned_ones_is_refused(
    database_url: str, tmp_path: Path
) -> None:
    """The issue's measurement: a stranger rewrote the store's reference and C's CMMD moved 5.857 -> 19.946, the
    controller accepting it. Here the trusted node's record pins the features; B's, scored against the rewrite,
    is refused with the reason and stores nothing."""
    _, eid = _distribution_evaluation(database_url, "pinned")
    jobs = _jobs(database_url, tmp_path)
    control = _answer(jobs, database_url, eid, "A", "pinned-vouched", _record(0.5) | _cmmd(6.172, HONEST))
    assert control.state == "completed", control.error
    arm = _answer(jobs, database_url, eid, "B", "pinned-b", _record(0.45) | _cmmd(19.946, FORGED))
    assert arm.state == "failed" and "refused, nothing stored" in arm.error, arm.error
    assert f"{LABEL!r} reference features (sha256 {FORGED[:16]}) are not the ones the controller pinned" in arm.error
    assert f"(sha256 {HONEST[:16]}, from node pinned-vouched)" in arm.error
    assert arm.extra.get("cmmd") is None and arm.val_flow_loss is None
    with session_scope(database_url) as session:
        run = session.get_one(Run, control.run_id)
        pin = session.get_one(ReferencePin, reference_key(LABEL, ArmSpec.model_validate(run.spec)))
        assert (pin.sha256, pin.node, pin.run_id, pin.label) == (HONEST, "pinned-vouched", run.id, LABEL)


def test_a_strangers_record_pins_nothing_and_a_value_without_its_features_is_refused(
    database_url: str, tmp_path: Path
) -> None:
    _, eid = _distribution_evaluation(database_url, "unpinned")
    jobs = _jobs(database_url, tmp_path)
    first = _answer(jobs, database_url, eid, "B", "unpinned-b", _record(0.45) | _cmmd(19.946, FORGED, OTHER_LABEL))
    assert first.state == "completed", first.error  # its own run, its own word: believed as before, never pinned
    with session_scope(database_url) as session:
        assert session.scalars(select(ReferencePin).where(ReferencePin.sha256 == FORGED)).all() == []
    bare = {k: v for k, v in _cmmd(6.0, HONEST, OTHER_LABEL).items() if k != "distribution_sha256"}
    control = _answer(jobs, database_url, eid, "A", "unpinned-vouched", _record(0.5) | bare)
    assert control.state == "failed" and "cmmd_extractor but no distribution_sha256" in control.error, control.error


def test_an_evaluation_job_carries_the_pins_of_the_labels_it_may_score_with(
    database_url: str, tmp_path: Path
) -> None:
    grid_id, eid = _distribution_evaluation(database_url, "carried")
    settings = Settings(database_url=database_url, home_dir=tmp_path)
    with session_scope(database_url) as session:
        runs = session.scalars(select(Run).where(Run.grid_id == grid_id).order_by(Run.id)).all()
        control = runs[0]
        key = reference_key(REAL_LABEL, ArmSpec.model_validate(control.spec))
        record = _cmmd(1.0, FORGED, REAL_LABEL) | {"step": 4}
        assert refused_references(session, control, "somebody", [record], set()) is None
        assert session.get(ReferencePin, key) is None  # an untrusted node pins nothing
        record = _cmmd(1.0, HONEST, REAL_LABEL) | {"step": 4}
        assert refused_references(session, control, "carried-vouched", [record], {"carried-vouched"}) is None
        session.flush()
        job = session.get_one(Evaluation, eid).results[1]  # B's job: the same split, so the same key
        args = evaluation_args(settings, session, job)
        assert args.evaluation is not None and args.evaluation.reference_pins[key] == HONEST


def test_a_training_record_naming_other_reference_features_fails_its_run_and_stores_nothing(
    database_url: str, tmp_path: Path
) -> None:
    """The same check on a training run's records, through the real launcher and a node that lies (the hostile
    agent, tests/orchestrator/fleet/hostile_agent.py: CMMD scored against features of sha256 FORGED)."""
    with session_scope(database_url) as session:
        grid = create_grid(session, GridCreate(name="trained-pinned", arms=["A"], overrides=tiny_overrides(steps=4)))
        run = grid.runs[0]
        session.add(ReferencePin(key=reference_key(LABEL, ArmSpec.model_validate(run.spec)), label=LABEL,
                                 sha256=HONEST, node="trusted-one", run_id=None))  # fmt: skip
        session.flush()
        run_id = run.id
    settings = Settings(database_url=database_url, home_dir=tmp_path / "storage", launcher_interval_s=0.2,
                        max_retries=0)  # fmt: skip
    launcher = Launcher(settings, local_agent=[sys.executable, str(HOSTILE), "other-reference", FORGED])
    launcher.start()
    try:
        wait_for(lambda: run_of(database_url, run_id).state == "failed", "the lying node's run to fail", 60)
    finally:
        assert launcher.stop()
    error = run_of(database_url, run_id).error or ""
    assert f"reference features (sha256 {FORGED[:16]}) are not the ones the controller pinned" in error, error
    assert "refused, nothing of the reply stored" in error
    with session_scope(database_url) as session:
        assert session.scalars(select(Metric).where(Metric.run_id == run_id)).all() == []


def test_a_diverged_runs_cmmd_nan_skips_its_job_and_the_evaluation_completes(database_url: str, tmp_path: Path) -> None:
    """Issue 63's "run 5: node local sent cmmd 'nan' with SE 'nan' ... refused, nothing stored", which failed the
    whole evaluation of the demo's grid: the diverged run's job is skipped with the reason, the others measured."""
    _, eid = _distribution_evaluation(database_url, "diverged-cmmd")
    with session_scope(database_url) as session:
        run = session.scalars(select(Run).join(Run.grid).where(Grid.name == "diverged-cmmd", Run.arm == "B")).one()
        run.decision, run.decision_step = "diverged", 4
    jobs = _jobs(database_url, tmp_path)
    nan = _cmmd(1.0, HONEST) | {"cmmd": "nan", "cmmd_se": "nan", "cmmd_samples": ["nan"] * SAMPLES}
    skipped = _answer(jobs, database_url, eid, "B", "diverged-cmmd-b", _record(0.45) | nan)
    measured = _answer(jobs, database_url, eid, "A", "diverged-cmmd-vouched", _record(0.5) | _cmmd(6.0, HONEST))
    assert (skipped.state, measured.state) == ("skipped", "completed"), (skipped.error, measured.error)
    assert "measures cmmd nan, cmmd_se nan" in skipped.error, skipped.error
    with session_scope(database_url) as session:
        evaluation = session.get_one(Evaluation, eid)
        assert (evaluation.state, evaluation.error) == ("completed", None)
