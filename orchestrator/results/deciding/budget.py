"""A deciding grid's budget: what it has spent, what its next work costs, and the caps no look queues work
past (results/deciding/decider.py asks before it queues anything).

- GPU-hours: the runs' held GPU-hours (each run's GPUs x the time the controller held them for it, from its
  own placement and end timestamps: what a node claims never lowers it) and the evaluation jobs' measured
  GPU-seconds, plus the next work's price (a seed: its arm's mean held GPU-hours, else the estimate the
  submit's worst case used; an evaluation: each job's start and its images at the slowest rate the grid's
  jobs measured), against decide.max_gpu_hours (grids/deciding.py: by default that worst case, stored with the grid).
- Looks and evaluations: decide.max_looks, decide.max_evaluations.
- Images: an images action asks for more images than the grid's largest evaluation asked for, or is none;
  where that evaluation measured fewer images than it asked, the readable count is the budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from model.spec import ArmSpec
from orchestrator.db.models import Evaluation, EvaluationResult, Grid, Run, aware, utcnow
from orchestrator.grids.deciding import (
    ESTIMATE,
    DecideSpec,
    decide_of,
    evaluation_job_hours,
    measures_of,
    with_budget,
)
from orchestrator.grids.evaluations import evaluated_runs, measured_by, ran_in_training
from orchestrator.grids.projection import project
from orchestrator.results.deciding import sequential
from orchestrator.results.evaluations import job_gpu_seconds
from orchestrator.runs.placement import arm_gpus
from orchestrator.vocabulary import EvaluationState


def budget_of(grid: Grid) -> DecideSpec:
    """The grid's decide with its caps: as stored at submit, else (a grid stored before them) the defaults
    from its arms' first runs (grids/deciding.py with_budget)."""
    decide = decide_of(grid)
    assert decide is not None
    arms = []
    for r in sorted(grid.runs, key=lambda r: r.position):
        if r.seed == 0:
            try:
                arms.append((r.arm, ArmSpec.model_validate(r.spec)))
            except ValueError:  # a spec this version no longer reads: priced as unknown
                continue
    return with_budget(decide, arms, grid.control_arm)


def _finite_hours(value: float | None) -> float | None:
    return float(value) if value is not None and math.isfinite(value) and value >= 0 else None


def held_hours(run: Run, now: datetime) -> float | None:
    """The GPU-hours the controller held for `run`: its arm's GPUs x the time from its placement to its end
    (to `now` while it runs), both as the controller recorded them; None for a run never placed. A node's
    `gpu_hours` record is its own word and counts for nothing here: one claiming 1e-6 for a run it held an
    hour would make that arm's seeds look free."""
    if run.started_at is None:
        return None
    try:
        gpus = arm_gpus(run.spec)
    except ValueError:  # a spec this version no longer reads: one GPU, the least an arm holds
        gpus = 1
    end = aware(run.finished_at) if run.finished_at is not None else aware(now)
    return max((end - aware(run.started_at)).total_seconds(), 0.0) / 3600 * gpus


def spent_gpu_hours(session: Session, grid: Grid) -> float:
    """What the grid has spent: its runs' held GPU-hours (held_hours) and every evaluation job's measured
    GPU-seconds (at most its placement-to-end time: results/evaluations.py job_gpu_seconds), but a training job's
    own (grids/evaluations.py ran_in_training): its time is inside its run's held hours."""
    now = utcnow()
    jobs = session.scalars(select(EvaluationResult).join(Evaluation).where(Evaluation.grid_id == grid.id))
    seconds = [_finite_hours(job_gpu_seconds(job)) for job in jobs if not ran_in_training(job)]  # in the run's
    runs = sum(h for h in (held_hours(r, now) for r in grid.runs) if h is not None)
    return runs + sum(s / 3600 for s in seconds if s is not None)


def evaluations_of(session: Session, grid: Grid) -> int:
    """Evaluations the grid has had (asked by the decider or by its user)."""
    return len(session.scalars(select(Evaluation.id).where(Evaluation.grid_id == grid.id)).all())


def run_hours(session: Session, run: Run) -> float:
    """What one more run like `run` costs: the mean held GPU-hours of its arm's ended runs (held_hours), else
    the estimate the worst case was priced at (grids/deciding.py worst_case_gpu_hours); 0 for a command arm
    unmeasured."""
    now = utcnow()
    ended = [r for r in run.grid.runs if r.arm == run.arm and r.finished_at is not None]
    measured = [h for h in (held_hours(r, now) for r in ended) if h]
    if measured:
        return sum(measured) / len(measured)
    try:
        p = project(ArmSpec.model_validate(run.spec), ESTIMATE)
    except ValueError:
        return 0.0
    return (p.hours or 0.0) + p.fixed_hours


def evaluation_hours(session: Session, grid: Grid, images: int, measures: Sequence[str] | None = None) -> float:
    """An evaluation of every evaluated run on `images` images measuring `measures` (None: what the grid's
    looks measure, grids/deciding.py measures_of): each job a start (estimated) and its images at the slowest
    per-image rate the grid's completed jobs of evaluations that measured the same metrics measured, else the
    estimate (a flow-only evaluation priced by its flow loss's passes alone)."""
    measures = tuple(measures) if measures is not None else measures_of(decide_of(grid))
    total, jobs = 0.0, evaluation_jobs(session, grid, measures)
    for run in evaluated_runs(grid):
        try:
            spec = ArmSpec.model_validate(run.spec)
        except ValueError:
            continue
        start = evaluation_job_hours(spec, 0, measures)
        rates = [max(s / 3600 - start, 0.0) / n for s, n in jobs if n > 0]
        total += start + images * (max(rates) if rates else evaluation_job_hours(spec, 1, measures) - start)
    return total


def over_budget(session: Session, grid: Grid, budget: DecideSpec, cost: float, evaluation: bool) -> str | None:
    """Which cap of the grid work costing `cost` GPU-hours (an evaluation, where `evaluation`) would pass, in
    words; None where it passes none (refusal_of, with the grid's spend and evaluations so far)."""
    return refusal_of(budget, spent_gpu_hours(session, grid), evaluations_of(session, grid), cost, evaluation)


def refusal_of(budget: DecideSpec, spent: float, evaluations: int, cost: float, evaluation: bool) -> str | None:
    """Which cap work costing `cost` GPU-hours (an evaluation, where `evaluation`) would pass after `spent`
    GPU-hours and `evaluations` evaluations, in words; None where it passes none."""
    if evaluation and budget.max_evaluations is not None and evaluations >= budget.max_evaluations:
        return f"at the evaluations budget: {budget.max_evaluations} evaluations (decide.max_evaluations)"
    if budget.max_gpu_hours is not None and spent + cost > budget.max_gpu_hours:
        return (f"at the GPU-hours budget: {spent:.4g} spent, the next work {cost:.4g} more, of "
                f"{budget.max_gpu_hours:.4g} (decide.max_gpu_hours)")  # fmt: skip
    return None


def next_images(max_images: int, asked: int | None, n: int) -> int | None:
    """The images the next images action would ask for: IMAGE_STEP x the largest evaluation's (or the n
    measured), at most max_images; None where that is no more than the grid already asked for or measured
    (no action: asking again measures the same images)."""
    want = min(max_images, sequential.IMAGE_STEP * max(asked or 0, n))
    return want if want > max(asked or 0, n) else None


def readable_images(asked: int | None, measured: int, max_images: int) -> tuple[int, str]:
    """(the images budget, a note for the look's reason): max_images, less the images the largest evaluation
    asked for and did not measure (images of the split that cannot be read)."""
    if asked is None or not 0 < measured < asked:
        return max_images, ""
    short = asked - measured
    budget = max(max_images - short, 1)
    return budget, (f"; images budget {budget}: the split's readable images (the largest evaluation measured "
                    f"{measured} of the {asked} it asked for)")  # fmt: skip


def evaluation_jobs(session: Session, grid: Grid, measures: Sequence[str] | None = None) -> list[tuple[float, int]]:
    """The grid's completed evaluation jobs as (measured GPU-seconds, at most the job's placement-to-end time:
    job_gpu_seconds; images): what an evaluation job's start and images are priced from (action_costs,
    evaluation_hours). `measures`: only the jobs of evaluations that measured those metrics (a full
    evaluation's images cost many times a flow-only one's)."""
    rows = session.execute(select(EvaluationResult, Evaluation).join(Evaluation).where(
        Evaluation.grid_id == grid.id, EvaluationResult.state == EvaluationState.completed)).all()  # fmt: skip
    same = [(job, e.images) for job, e in rows if (measures is None or set(measured_by(e)) == set(measures))
            and not ran_in_training(job)]  # a training job's own: no start, not what a job costs  # fmt: skip
    jobs = [(_finite_hours(job_gpu_seconds(job)), int(n)) for job, n in same]
    return [(s, n) for s, n in jobs if s is not None]
