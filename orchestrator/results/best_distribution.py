"""The distribution pass at each run's best checkpoint. While training, eval.distribution runs the pass at every
k-th checkpoint and the last (worker/distribution.py); which checkpoint is the best is known only once the run
has ended. So when a grid's last run has ended, before its report is written (reports/write.py), one evaluation
of every run's best checkpoint (grids/evaluations.py, step "best", the spec's samples and metrics) is queued
where some run's best checkpoint was not measured: sample i from the same prompt and noise in every run, so the
values pair across arms as the training pass's do. The evaluation is asked for its distribution metrics only:
its images' metrics never replace the training records' (evaluations.py largest_evaluation), and the report
reads its values at the best checkpoints (evaluated_rows.py). A `distribution.best` event on the grid says what
was queued or why nothing could be, once: a grid is never asked twice.
"""

from __future__ import annotations

from sqlalchemy import exists, select
from sqlalchemy.orm import Session

from orchestrator.db.models import Evaluation, Event, Grid, Metric, Run
from orchestrator.errors import InvalidBody
from orchestrator.grids.evaluations import EvaluationCreate, create_evaluation, evaluated_runs

EVENT = "distribution.best"


def _asked(run: Run) -> dict:
    return (((run.spec or {}).get("eval") or {}).get("distribution")) or {}


def _unmeasured(session: Session, runs: list[Run], metrics: list[str]) -> list[Run]:
    """The runs whose best checkpoint's record lacks one of `metrics` (the pass skipped that checkpoint)."""
    out = []
    for run in runs:
        if run.best_step is None:
            continue
        row = session.scalar(select(Metric).where(Metric.run_id == run.id, Metric.step == run.best_step))
        if row is None or any(m not in (row.extra or {}) for m in metrics):
            out.append(run)
    return out


def queue_best_pass(session: Session, grid: Grid) -> Evaluation | None:
    """Queue the distribution pass at every run's best checkpoint where one was not measured (the caller
    commits); None where the grid measures no distribution metric, every best checkpoint was measured, or it
    was asked before. Call it once every run of the grid has ended."""
    if session.scalar(select(exists().where(Event.grid_id == grid.id, Event.kind == EVENT))):
        return None
    runs = evaluated_runs(grid)
    specs = [d for r in runs if (d := _asked(r)).get("metrics")]
    if not specs:
        return None
    metrics = list(dict.fromkeys(m for d in specs for m in d["metrics"]))
    missing = _unmeasured(session, runs, metrics)
    if not missing:
        return None
    names = ", ".join(f"{r.arm} s{r.seed} (best step {r.best_step})" for r in missing)
    samples = min(int(d.get("samples") or 0) for d in specs) or None
    try:
        evaluation = create_evaluation(session, grid, EvaluationCreate(step="best", samples=samples, metrics=metrics),
                                       distribution_only=True)  # fmt: skip
    except InvalidBody as exc:
        why = exc.message()
        session.add(Event(grid_id=grid.id, kind=EVENT, message=f"the distribution pass at the best checkpoints "
                          f"could not be queued: {why}. Not measured there: {names}", data={"queued": False}))
        return None
    session.add(Event(grid_id=grid.id, kind=EVENT, data={"queued": True, "evaluation": evaluation.id},
                      message=f"the distribution pass at each run's best checkpoint queued (evaluation "
                              f"{evaluation.id}: {', '.join(metrics)} on {samples} samples): the training "
                              f"pass did not measure {names}"))  # fmt: skip
    session.flush()
    return evaluation
