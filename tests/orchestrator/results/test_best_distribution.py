"""The distribution pass at each run's best checkpoint (results/best_distribution.py) on a real database: queued
once when a grid's best checkpoints were not measured by the training pass, never when they were; the report
waits for it; its images' metrics never become the evaluation the effects use."""

from __future__ import annotations

from sqlalchemy import select

from orchestrator.db.models import EvaluationResult, Event, Grid
from orchestrator.db.session import session_scope
from orchestrator.fleet.inventory import LOCAL
from orchestrator.grids.evaluations import ASKED, DISTRIBUTION_ONLY
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.results.best_distribution import EVENT, queue_best_pass
from orchestrator.results.evaluations import largest_evaluation
from orchestrator.results.reports.write import due_grids
from orchestrator.runs.ingest import insert_metrics

SAMPLES = 16


def _grid(database_url: str, best_measured: bool) -> int:
    """Two arms x 2 seeds, ended at step 20, each run's best checkpoint step 10, whose record carries CMMD only
    if `best_measured` (the last one, step 20, always does)."""
    arm = {"parent": "A", "eval": {"distribution": {"metrics": ["cmmd"], "samples": SAMPLES}},
           "data": {"held_out": 64}}  # fmt: skip
    with session_scope(database_url) as session:
        grid = create_grid(session, GridCreate(name="best pass", arms=[{**arm, "name": "base"}, {**arm, "name": "b"}],
                                               control="base", seeds=2))  # fmt: skip
        for run in grid.runs:
            cmmd = {"cmmd": 0.5, "cmmd_n": SAMPLES, "cmmd_extractor": "clip-vit-l-14-336"}
            insert_metrics(session, run.id, [{"step": 10, "val_flow_loss": 0.4, **(cmmd if best_measured else {})},
                                             {"step": 20, "val_flow_loss": 0.45, **cmmd}])  # fmt: skip
            run.state, run.last_checkpoint_step, run.best_step = "completed", 20, 10
        return grid.id


def test_the_pass_at_the_best_checkpoints_is_queued_once_and_the_report_waits_for_it(database_url: str) -> None:
    grid_id = _grid(database_url, best_measured=False)
    with session_scope(database_url) as session:
        assert grid_id in due_grids(session)
        evaluation = queue_best_pass(session, session.get(Grid, grid_id))
        assert evaluation is not None and evaluation.step == "best"
        jobs = evaluation.results
        assert len(jobs) == 4 and {j.step for j in jobs} == {10}
        assert all(j.extra[ASKED] == {"samples": SAMPLES, "metrics": ["cmmd"], DISTRIBUTION_ONLY: True} for j in jobs)
        (event,) = session.scalars(select(Event).where(Event.grid_id == grid_id, Event.kind == EVENT))
        assert "base s0 (best step 10)" in event.message and event.data["evaluation"] == evaluation.id
    with session_scope(database_url) as session:
        assert grid_id not in due_grids(session)  # the report waits for the queued pass
        assert queue_best_pass(session, session.get(Grid, grid_id)) is None  # asked once
        for job in session.scalars(select(EvaluationResult).where(EvaluationResult.evaluation_id == evaluation.id)):
            job.state, job.node, job.extra = "completed", LOCAL, {**job.extra, "cmmd": 0.6, "cmmd_n": SAMPLES}
        evaluation = session.merge(evaluation)
        evaluation.state = "completed"
    with session_scope(database_url) as session:
        assert grid_id in due_grids(session)
        # its images' metrics stand for nothing: the effects keep the training records'
        assert largest_evaluation(session, session.get(Grid, grid_id)) == (None, {})


def test_nothing_is_queued_where_the_best_checkpoints_were_measured(database_url: str) -> None:
    grid_id = _grid(database_url, best_measured=True)
    with session_scope(database_url) as session:
        assert queue_best_pass(session, session.get(Grid, grid_id)) is None
        assert not session.scalars(select(Event).where(Event.grid_id == grid_id, Event.kind == EVENT)).all()
