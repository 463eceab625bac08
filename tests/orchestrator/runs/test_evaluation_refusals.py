"""An evaluation job on a node that fails it or sends what the controller refuses: the job and its
evaluation end failed with the reason, nothing of the reply is stored, and the launcher serves on. The
"node" is the hostile stand-in agent over pipes (tests/orchestrator/fleet/hostile_agent.py): no Ray."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from orchestrator.db.models import Evaluation, Metric, Run
from orchestrator.db.session import session_scope
from orchestrator.grids.evaluations import EvaluationCreate, create_evaluation
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.runs.launcher import Launcher
from orchestrator.settings import Settings
from tests.kit.polling import wait_for
from tests.kit.settings import tiny_overrides

HOSTILE = Path(__file__).parents[1] / "fleet" / "hostile_agent.py"
STEP = 4


def evaluation_of_a_finished_grid(database_url: str, name: str) -> int:
    """A grid whose one run ended with a checkpoint at STEP, and an evaluation of it on 2 images."""
    with session_scope(database_url) as session:
        grid = create_grid(session, GridCreate(name=name, arms=["A"], overrides=tiny_overrides(steps=STEP)))
        run = grid.runs[0]
        run.state, run.last_checkpoint_step = "completed", STEP
        session.add(Metric(run_id=run.id, step=STEP, val_flow_loss=0.5, extra={}))
        session.flush()
        return create_evaluation(session, grid, EvaluationCreate(images=2)).id


@pytest.mark.parametrize(("mode", "arg", "reason"), [
    ("error-text", "CUDA out of memory", "CUDA out of memory"),
    ("negative-loss", "", "sent a record of step 1 with train_loss -3 is outside its range"),
    ("other-run", "", "claims run"),
])  # fmt: skip
def test_a_job_the_node_fails_or_lies_about_fails_with_the_reason(
    mode: str, arg: str, reason: str, database_url: str, tmp_path: Path
) -> None:
    eid = evaluation_of_a_finished_grid(database_url, f"refused-{mode}")
    settings = Settings(database_url=database_url, home_dir=tmp_path, launcher_interval_s=0.2, max_retries=0)
    launcher = Launcher(settings, local_agent=[sys.executable, str(HOSTILE), mode, arg])
    launcher.start()
    try:
        def ended() -> bool:
            with session_scope(database_url) as session:
                return session.get(Evaluation, eid).state == "failed"

        wait_for(ended, f"the {mode} node's evaluation to fail", 60)
        assert launcher._thread is not None and launcher._thread.is_alive()  # the controller serves on
    finally:
        assert launcher.stop()
    with session_scope(database_url) as session:
        evaluation = session.get(Evaluation, eid)
        (job,) = evaluation.results
        assert reason in evaluation.error and reason in job.error, (evaluation.error, job.error)
        assert evaluation.error.startswith(f"run {job.run_id}: ") and job.val_flow_loss is None
        rows = session.scalars(select(Metric).join(Run).where(Run.id == job.run_id)).all()
        assert [(m.step, m.val_flow_loss) for m in rows] == [(STEP, 0.5)]  # the run's own row, untouched
