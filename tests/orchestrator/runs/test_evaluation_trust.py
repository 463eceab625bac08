"""An evaluation runs, and is believed, where its run's values may be: the run's own node or a trusted one,
and only a trusted one for the control of a grid with control_on_trusted (runs/trust.py). Its record
measures the images asked for, and the wall time it claims is bounded by what the controller saw. On a
real database, through the launcher's EvaluationJobs and the report as they run."""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from orchestrator.db.models import Evaluation, EvaluationResult, Grid, Metric, Node, Run, utcnow
from orchestrator.db.session import session_scope
from orchestrator.fleet.inventory import LOCAL
from orchestrator.fleet.node_pool import NodePool
from orchestrator.grids.evaluations import EvaluationCreate, create_evaluation
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.results.evaluations import EvaluationView, evaluation_warnings, largest_evaluation
from orchestrator.results.reports.build import build_report
from orchestrator.runs.evaluation_jobs import EvaluationJobs, JobWorker
from orchestrator.runs.trust import evaluation_nodes, trusted_nodes
from orchestrator.settings import Settings
from tests.kit.settings import tiny_overrides
from worker.protocol import WorkerReply
from worker.worker_names import evaluation_worker_name

STEP, IMAGES = 4, 16
# Honest per-image flow losses: the control A worse than B by 0.05 on every image.
A_LOSS, B_LOSS, LIE = 0.50, 0.45, 0.40


def _node(name: str, trusted: bool) -> Node:
    return Node(name=name, host="203.0.113.9", user="u", key_path="/k", trusted=trusted, declared_gpus=1)


def _samples(mean: float, n: int) -> list[float]:
    return [mean + (0.01 if i % 2 else -0.01) for i in range(n)]


def _grid(database_url: str, name: str, control_on_trusted: bool = False) -> tuple[int, int]:
    """Grid `name`: control A trained on node `<name>-a`, B on `<name>-b` (neither trusted), both ended at
    STEP with 4 images' records; `<name>-vouched` trusted, `<name>-x` a stranger. (grid id, evaluation id
    on IMAGES images)."""
    with session_scope(database_url) as session:
        session.add_all([_node(f"{name}-{n}", trusted=n == "vouched") for n in ("a", "b", "vouched", "x")])
        overrides = tiny_overrides(steps=STEP)
        overrides["data"]["held_out"] = IMAGES
        grid = create_grid(session, GridCreate(name=name, arms=["A", "B"], overrides=overrides, control="A",
                                               control_on_trusted=control_on_trusted))  # fmt: skip
        for run, loss in zip(grid.runs, (A_LOSS, B_LOSS), strict=True):
            node = f"{name}-{run.arm.lower()}"
            run.state, run.last_checkpoint_step, run.node, run.nodes = "completed", STEP, node, [node]
            session.add(Metric(run_id=run.id, step=STEP, val_flow_loss=loss, val_flow_loss_n=4,
                               val_flow_loss_se=0.005, extra={"val_flow_loss_samples": _samples(loss, 4)}))  # fmt: skip
        session.flush()
        return grid.id, create_evaluation(session, grid, EvaluationCreate(images=IMAGES)).id


def _jobs(database_url: str, tmp_path: Path) -> EvaluationJobs:
    """The launcher's evaluation jobs over a node pool with no node up: a start reaches no node."""
    settings = Settings(database_url=database_url, home_dir=tmp_path, max_retries=0)
    return EvaluationJobs(settings, NodePool(settings))


def _job(session, eid: int, arm: str) -> EvaluationResult:  # noqa: ANN001
    return session.scalars(select(EvaluationResult).join(Run).where(
        EvaluationResult.evaluation_id == eid, Run.arm == arm)).one()  # fmt: skip


def _record(loss: float, rows: int = IMAGES, **more: object) -> dict:
    """A job's record of `rows` images (an honest one has IMAGES)."""
    return {"step": STEP, "val_flow_loss": loss, "val_flow_loss_n": rows,
            "val_flow_loss_se": 0.002, "val_flow_loss_samples": _samples(loss, rows), "evaluated_images": IMAGES,
            "wall_time_s": 3.0, **more}  # fmt: skip


def _answer(jobs: EvaluationJobs, database_url: str, eid: int, arm: str, node: str, record: dict) -> EvaluationResult:
    """The job of `arm` placed on `node` a few seconds ago, and `record` its node's answer: the job after."""
    with session_scope(database_url) as session:
        job = _job(session, eid, arm)
        job.state, job.node, job.started_at = "running", node, utcnow() - timedelta(seconds=5)
        job_id, name = job.id, evaluation_worker_name(job.id, job.attempt)
        record = {**record, "run_id": job.run_id}
    reply = WorkerReply.model_validate({"state": "done", "info": {"pid": 1}, "records": [record]})
    assert jobs.collect(JobWorker(job_id, name, node), reply)
    with session_scope(database_url) as session:
        job = session.get_one(EvaluationResult, job_id)
        session.expunge(job)
        return job


# -- placement ------------------------------------------------------------------------------------------


def test_a_controls_evaluation_never_goes_to_a_stranger_with_control_on_trusted(
    database_url: str, tmp_path: Path
) -> None:
    _, eid = _grid(database_url, "placed", control_on_trusted=True)
    jobs = _jobs(database_url, tmp_path)
    jobs.launch({"placed-x": 4})  # a stranger: the node of the flipped verdict
    jobs.launch({"placed-a": 4})  # the control's own node, not trusted
    with session_scope(database_url) as session:
        control = _job(session, eid, "A")
        assert (control.state, control.node) == ("queued", None)
        assert "node placed-a is not trusted" in control.error, control.error  # it says why it waits
        assert "control_on_trusted" in control.error, control.error
        arm = _job(session, eid, "B")
        assert (arm.state, arm.node) == ("queued", None)  # B's own node had no GPU free: B waits too
        assert "placed-a never ran this run" in arm.error and "placed-b" in arm.error, arm.error

        free = {LOCAL: 1, "placed-x": 4, "placed-a": 2, "placed-b": 1, "placed-vouched": 2}
        trusted = trusted_nodes(session)
        assert evaluation_nodes(control.run, free, trusted) == {LOCAL: 1, "placed-vouched": 2}
        assert evaluation_nodes(arm.run, free, trusted) == {LOCAL: 1, "placed-b": 1, "placed-vouched": 2}
        control.run.grid.control_on_trusted = False  # without it the control's own node may evaluate it
        assert evaluation_nodes(control.run, free, trusted) == {LOCAL: 1, "placed-a": 2, "placed-vouched": 2}


# -- reading --------------------------------------------------------------------------------------------


def _effect(report, metric: str = "val_flow_loss") -> float:  # noqa: ANN001
    (effect,) = [e for e in report.effects if e.metric == metric and e.arm == "B"]
    return effect.diff


@pytest.mark.parametrize("how", ["stored before the fix", "node untrusted since"])
def test_a_strangers_evaluation_never_replaces_a_runs_values_and_is_a_warning(
    database_url: str, tmp_path: Path, how: str
) -> None:
    """The control's evaluation job on a node that never trained it, lying in range (A better than B on
    the evaluation's images): the report's B - A stays the honest training difference."""
    name = "stranger" if how == "stored before the fix" else "untrusted"
    grid_id, eid = _grid(database_url, name)
    jobs = _jobs(database_url, tmp_path)
    control_node = f"{name}-x" if how == "stored before the fix" else f"{name}-vouched"
    control = _answer(jobs, database_url, eid, "A", control_node, _record(LIE))
    arm = _answer(jobs, database_url, eid, "B", f"{name}-b", _record(B_LOSS))
    assert (control.state, arm.state) == ("completed", "completed"), (control.error, arm.error)
    with session_scope(database_url) as session:
        if how == "node untrusted since":
            session.scalars(select(Node).where(Node.name == control_node)).one().trusted = False
    with session_scope(database_url) as session:
        evaluation = session.get_one(Evaluation, eid)
        assert evaluation.state == "completed"
        grid = session.get_one(Grid, grid_id)
        info, rows = largest_evaluation(session, grid)
        assert info is not None and info.id == eid and set(rows) == {arm.run_id}  # B's own node: believed
        report = build_report(session, grid)
        assert _effect(report) == pytest.approx(B_LOSS - A_LOSS)  # the lie would make it +0.05
        (warning,) = evaluation_warnings(session, grid)[control.run_id]
        assert f"node {control_node} never ran this run (the run's nodes: {name}-a) and is not trusted" in warning
        assert f"val_flow_loss {LIE:g}" in warning and f"on {IMAGES} images" in warning, warning
        (a_report,) = [a for a in report.arms if a.arm == "A"]
        assert warning in a_report.fallbacks  # where the report names what it did instead

        from orchestrator.dashboard.data import grid_detail

        detail = grid_detail(session, grid)
        (a_row,) = [r for r in detail["runs"] if r["arm"] == "A"]
        assert warning in a_row["warnings"]


def test_a_trusted_nodes_evaluation_of_another_nodes_run_is_believed(database_url: str, tmp_path: Path) -> None:
    grid_id, eid = _grid(database_url, "vouching")
    jobs = _jobs(database_url, tmp_path)
    _answer(jobs, database_url, eid, "A", "vouching-vouched", _record(LIE))
    _answer(jobs, database_url, eid, "B", LOCAL, _record(B_LOSS))
    with session_scope(database_url) as session:
        grid = session.get_one(Grid, grid_id)
        _, rows = largest_evaluation(session, grid)
        assert len(rows) == 2 and evaluation_warnings(session, grid) == {}
        assert _effect(build_report(session, grid)) == pytest.approx(B_LOSS - LIE)


# -- the record ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("rows", "more", "reason"), [
    (IMAGES - 1, {}, f"val_flow_loss_n 15, not 16 rows for the {IMAGES} images asked for"),
    (IMAGES - 1, {"skipped_files": ["held/7.png"]}, "the run's own records never named: held/7.png"),
    (IMAGES, {"evaluated_images": IMAGES + 1}, "evaluated_images 17, not the 16 images asked for"),
    (IMAGES, {"recon_lpips": 0.3, "recon_lpips_n": IMAGES - 1}, "recon_lpips_n 15, not 16 rows"),
    (IMAGES, {"val_flow_loss_grid": [[0.5] * 8] * (IMAGES - 1)}, "15 rows in val_flow_loss_grid, not 16"),
])  # fmt: skip
def test_a_record_of_other_than_the_images_asked_for_is_refused(
    database_url: str, tmp_path: Path, rows: int, more: dict, reason: str
) -> None:
    _, eid = _grid(database_url, f"rows-{len(reason)}-{rows}")
    job = _answer(_jobs(database_url, tmp_path), database_url, eid, "B", LOCAL, _record(B_LOSS, rows, **more))
    assert job.state == "failed" and reason in job.error, job.error
    assert job.val_flow_loss is None and "refused, nothing stored" in job.error


def test_a_held_out_image_the_run_named_unreadable_may_be_left_out(database_url: str, tmp_path: Path) -> None:
    _, eid = _grid(database_url, "named-unreadable")
    with session_scope(database_url) as session:
        _job(session, eid, "B").run.fallbacks = ["unreadable image left out: held/7.png"]
    record = _record(B_LOSS, IMAGES - 1, skipped_files=["held/7.png"])
    job = _answer(_jobs(database_url, tmp_path), database_url, eid, "B", LOCAL, record)
    assert job.state == "completed" and job.val_flow_loss_n == IMAGES - 1, job.error


@pytest.mark.parametrize("claimed", [1e29, "inf", "nan"])
def test_a_claimed_wall_time_is_bounded_by_what_the_controller_saw(
    database_url: str, tmp_path: Path, claimed: float | str
) -> None:
    _, eid = _grid(database_url, f"wall-{claimed}")
    job = _answer(_jobs(database_url, tmp_path), database_url, eid, "B", LOCAL,
                  _record(B_LOSS, wall_time_s=claimed))  # fmt: skip
    assert job.state == "completed", job.error
    seen = job.extra["wall_time_seen_s"]
    assert 5 <= seen < 60 and job.wall_time_s == seen and job.gpu_seconds == seen, (seen, job.wall_time_s)
    assert math.isfinite(job.gpu_hours) and "wall_time_s" not in job.extra.get("nonfinite", {})
    assert job.extra["wall_time_claimed_s"] == claimed  # the claim, kept beside the bound


def test_a_wall_time_within_what_the_controller_saw_is_kept(database_url: str, tmp_path: Path) -> None:
    _, eid = _grid(database_url, "wall-honest")
    job = _answer(_jobs(database_url, tmp_path), database_url, eid, "B", LOCAL, _record(B_LOSS))
    assert (job.wall_time_s, job.gpu_seconds) == (3.0, 3.0)


def test_a_cost_stored_before_it_was_bounded_reads_as_the_jobs_time(database_url: str, tmp_path: Path) -> None:
    """A job stored with gpu_seconds 2e29 (the node's 1e29 s, before the bound): the evaluation's view, which
    `ablate evaluate` and the API show, prices it at its placement-to-end time."""
    _, eid = _grid(database_url, "wall-stored")
    job = _answer(_jobs(database_url, tmp_path), database_url, eid, "B", LOCAL, _record(B_LOSS))
    with session_scope(database_url) as session:
        row = session.get_one(EvaluationResult, job.id)
        row.gpu_seconds, row.finished_at = 2e29, row.started_at + timedelta(seconds=7)
        session.flush()
        view = EvaluationView.from_row(session.get_one(Evaluation, eid))
        assert [r.gpu_seconds for r in view.runs if r.id == job.id] == [pytest.approx(7.0)]
        assert view.gpu_seconds == pytest.approx(7.0)


def test_a_diverged_runs_non_finite_checkpoint_is_skipped_and_named_and_the_others_measured(
    database_url: str, tmp_path: Path
) -> None:
    """Issue 63, bad input from honest runs: `ablate evaluate` on the demo's grid failed as a whole ("run 5: node
    local sent cmmd 'nan' ... refused, nothing stored"), run 5 being the arm the detector stopped as diverged."""
    _, eid = _grid(database_url, "diverged")
    with session_scope(database_url) as session:
        diverged = _job(session, eid, "B").run
        diverged.decision, diverged.decision_step = "diverged", STEP
    jobs = _jobs(database_url, tmp_path)
    nan = {"step": STEP, "val_flow_loss": "nan", "val_flow_loss_n": IMAGES, "val_flow_loss_se": "nan",
           "val_flow_loss_samples": ["nan"] * IMAGES, "evaluated_images": IMAGES, "wall_time_s": 3.0}  # fmt: skip
    skipped = _answer(jobs, database_url, eid, "B", LOCAL, nan)
    control = _answer(jobs, database_url, eid, "A", LOCAL, _record(A_LOSS))
    assert (skipped.state, control.state) == ("skipped", "completed"), (skipped.error, control.error)
    assert control.val_flow_loss == pytest.approx(A_LOSS)
    with session_scope(database_url) as session:
        view = EvaluationView.from_row(session.get_one(Evaluation, eid))
    assert view.state == "completed" and view.error is None
    (why,) = view.skipped
    assert why.startswith(f"run {skipped.run_id} diverged (the detector stopped it at step {STEP})"), why
    assert "measures val_flow_loss nan" in why and "the other runs measured" in why
