"""A grid's evaluations (its stored checkpoints evaluated again on more held-out images) as views, and the
largest completed one, whose per-run rows the report's effects use in place of the training records'. The
distribution metrics (CMMD, DINO-MMD, FD-DINOv2) come from the completed evaluation that generated the most
samples for them, else from the training records, whichever evaluation the images' metrics use.

An `EvaluationResult` row carries the same metric columns, `extra` and `step` as a `Metric` row, so the
report's statistics read it unchanged.

A row stands for its run's values only where the node that ran the job may speak for the run
(runs/trust.py evaluator_refused: the run's own node or a trusted one; a trusted one for the control of a
grid with control_on_trusted), checked here when read, so the report, the decider, the dashboard and the
trackers all apply it, to rows stored before placement was held to it and to nodes untrusted since. A row
that may not is never used: `evaluation_warnings` says so on its run, with its evidence.
"""

from __future__ import annotations

import math
from typing import Any, Self

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestrator.db.models import Evaluation, EvaluationResult, Grid, aware
from orchestrator.grids.evaluations import ASKED, DISTRIBUTION_ONLY, EVERY_METRIC, measured_by, ran_in_training
from orchestrator.results.reports.model import EvaluationUsed
from orchestrator.results.reports.stats import DISTRIBUTION
from orchestrator.results.views import MetricValues, Public, UTCDatetime
from orchestrator.runs.evaluation_record import JOB_GPUS
from orchestrator.runs.trust import evaluator_refused, trusted_nodes
from orchestrator.vocabulary import EvaluationState

# The values a warning about a row not used quotes as its evidence, those the row has.
EVIDENCE = ("val_flow_loss", "recon_lpips", "text_lpips", "text_manip_delta")


class EvaluationRun(MetricValues):  # type: ignore[misc, valid-type]
    """One run's job of an evaluation: where it stands and, once completed, what it measured."""

    id: int
    run_id: int
    step: int  # the checkpoint evaluated
    state: str  # an EvaluationState
    attempt: int
    node: str | None
    error: str | None
    gpu_seconds: float | None  # the node's measured time on its GPU
    distribution: dict[str, Any] = {}  # the distribution metrics' value, _se, _n, _extractor; distribution_seconds
    # scored by the run's own training job at its end, the model loaded: no start of its own, its GPU time
    # inside the run's (runs/in_training.py)
    in_training: bool = False


class EvaluationView(Public):
    """GET /api/grids/{id}/evaluations/{eid}: the evaluation, what it cost so far, each run's job."""

    id: int
    grid_id: int
    images: int
    step: str  # as asked: "final", "best" or a step number
    state: str  # an EvaluationState
    error: str | None
    created_at: UTCDatetime
    finished_at: UTCDatetime | None
    gpu_seconds: float  # the jobs' measured GPU time, summed over those that reported
    samples: int | None = None  # generated samples for the distribution metrics (None: not asked)
    metrics: list[str] = []  # the distribution metrics asked
    # The per-image metrics its jobs measure: every one, or the flow loss alone (a deciding grid's look whose
    # decided metrics are the flow loss's: no LPIPS sampling; grids/evaluations.py)
    measures: list[str] = list(EVERY_METRIC)
    # Why its queued jobs wait, as the launcher last said (no node up, no GPUs, all busy); None: none waits.
    waiting: str | None = None
    runs: list[EvaluationRun]
    skipped: list[str] = []  # each skipped job's reason (a diverged run's checkpoint), "run N diverged ..."
    in_training: bool = False  # every job scored inside its run's training job (runs/in_training.py)

    @classmethod
    def from_row(cls, evaluation: Evaluation) -> Self:
        runs = [EvaluationRun.model_validate(r).model_copy(update={"gpu_seconds": job_gpu_seconds(r),
                                                                   "distribution": _distribution(r),
                                                                   "in_training": ran_in_training(r)})
                for r in evaluation.results]  # fmt: skip
        cost = sum(r.gpu_seconds or 0.0 for r in runs)
        waiting = next((r.error for r in runs if r.state == EvaluationState.queued and r.error), None)
        asked = _asked(evaluation)
        return cls(
            id=evaluation.id, grid_id=evaluation.grid_id, images=evaluation.images, step=evaluation.step,
            state=evaluation.state, error=evaluation.error, created_at=evaluation.created_at,
            finished_at=evaluation.finished_at, gpu_seconds=cost, runs=runs,
            samples=asked.get("samples"), metrics=asked.get("metrics") or [], waiting=waiting,
            measures=list(measured_by(evaluation)),
            skipped=[r.error or f"run {r.run_id}" for r in runs if r.state == EvaluationState.skipped],
            in_training=bool(runs) and all(r.in_training for r in runs),
        )  # fmt: skip


def _distribution(row: EvaluationResult) -> dict[str, Any]:
    """A job's distribution metrics (in its `extra`), without their per-sample lists."""
    extra = row.extra or {}
    keys = [f"{m}{part}" for m in DISTRIBUTION for part in ("", "_se", "_n", "_extractor")]
    return {k: extra[k] for k in (*keys, "distribution_seconds") if k in extra}


def job_gpu_seconds(row: EvaluationResult) -> float | None:
    """A job's stored GPU-seconds, at most its placement-to-end time as the controller saw it: a cost
    stored before the controller bounded it (1e29) reads as that time. None where nothing was measured."""
    cost = row.gpu_seconds
    if cost is None or not math.isfinite(cost):
        return None
    if row.finished_at is None:
        return cost
    span = (aware(row.finished_at) - aware(row.started_at or row.created_at)).total_seconds()
    return min(cost, max(span, 0.0) * JOB_GPUS)


def _completed(session: Session, grid: Grid) -> list[Evaluation]:
    """The grid's completed evaluations, the most images first (the newest of equals)."""
    return list(session.scalars(
        select(Evaluation)
        .where(Evaluation.grid_id == grid.id, Evaluation.state == EvaluationState.completed)
        .order_by(Evaluation.images.desc(), Evaluation.id.desc())
    ))  # fmt: skip


def _believed(evaluation: Evaluation, trusted: set[str]) -> tuple[dict[int, EvaluationResult], dict[int, str]]:
    """The evaluation's completed rows that may stand for their runs' values, per run id, and why each
    other completed row may not (evaluator_refused), per run id."""
    rows, refused = {}, {}
    for row in evaluation.results:
        if row.state != EvaluationState.completed:
            continue
        why = evaluator_refused(row.run, row.node, trusted)
        if why is None:
            rows[row.run_id] = row
        else:
            refused[row.run_id] = why
    return rows, refused


def largest_evaluation(session: Session, grid: Grid) -> tuple[EvaluationUsed | None, dict[int, EvaluationResult]]:
    """The grid's completed evaluation with the most images (the newest of equals) and its row per run id,
    only the rows whose node may speak for the run (`_believed`), of the largest with any such row;
    (None, {}) when the grid has none. A run it has no row for takes its row from an older completed
    evaluation of the same images and step: a catch-up (results/deciding/decider.py) scores only the runs
    not yet scored, and one run's value on the same images and checkpoint is the same whichever job measured
    it. One asked only for distribution metrics (results/best_distribution.py) is not a candidate."""
    trusted = trusted_nodes(session)
    candidates = [e for e in _completed(session, grid) if not _asked(e).get(DISTRIBUTION_ONLY)]
    for i, found in enumerate(candidates):
        rows, _ = _believed(found, trusted)
        if not rows:
            continue
        for older in candidates[i + 1:]:  # the newest row of each run wins
            if (older.images, older.step) == (found.images, found.step):
                for run_id, row in _believed(older, trusted)[0].items():
                    rows.setdefault(run_id, row)
        used = EvaluationUsed(id=found.id, images=found.images, step=found.step, measures=list(measured_by(found)),
                              in_training=sum(ran_in_training(r) for r in rows.values()))  # fmt: skip
        return used, rows
    return None, {}


def evaluation_warnings(session: Session, grid: Grid) -> dict[int, list[str]]:
    """Per run id, a warning for each completed evaluation row of the grid that may not stand for the run's
    values: the node that ran it, why, and what it claimed; the run's own values are used instead."""
    trusted, out = trusted_nodes(session), {}
    for evaluation in _completed(session, grid):
        rows = {r.run_id: r for r in evaluation.results}
        for run_id, why in _believed(evaluation, trusted)[1].items():
            row = rows[run_id]
            claimed = ", ".join(f"{m} {v:.4g}" for m in EVIDENCE if isinstance(v := getattr(row, m), int | float))
            out.setdefault(run_id, []).append(
                f"evaluation {evaluation.id} of this run not used: {why}; it claimed "
                f"{claimed or 'no metric'} at step {row.step} on {evaluation.images} images. "
                "The run's own values stand"
            )
    return out


def distribution_evaluations(session: Session, grid: Grid) -> tuple[list[EvaluationUsed],
                                                                     dict[int, list[EvaluationResult]]]:
    """The grid's completed evaluations that generated samples for distribution metrics (fewest samples first,
    so a reader that lets later rows win keeps the most samples), and their believed rows per run id that carry
    distribution values (results/evaluated_rows.py puts them on the checkpoint they measured)."""
    trusted, found = trusted_nodes(session), []
    for evaluation in reversed(_completed(session, grid)):  # the oldest of equal images first
        asked = _asked(evaluation)
        rows = [r for r in _believed(evaluation, trusted)[0].values() if distribution_keys(r.extra)]
        if rows and isinstance(samples := asked.get("samples"), int):
            found.append((samples, evaluation, rows))
    found.sort(key=lambda f: f[0])  # stable: of equal samples, the order above
    used = [EvaluationUsed(id=e.id, images=e.images, step=e.step, samples=n) for n, e, _ in found]
    per_run: dict[int, list[EvaluationResult]] = {}
    for _, _, rows in found:
        for row in rows:
            per_run.setdefault(row.run_id, []).append(row)
    return used, per_run


def _asked(evaluation: Evaluation) -> dict[str, Any]:
    """The distribution samples and metrics the evaluation's jobs were asked for ({} if none)."""
    return next((a for r in evaluation.results if isinstance(a := (r.extra or {}).get(ASKED), dict)), {})


# a distribution metric's keys in a row's extra (an MMD's per-reference values: model/distribution_pass.py)
DISTRIBUTION_PARTS = ("", "_se", "_n", "_extractor", "_samples", "_per_reference")


def distribution_keys(extra: dict[str, Any] | None, metrics: tuple[str, ...] = DISTRIBUTION) -> dict[str, Any]:
    """The `metrics`' values in `extra` (each distribution metric with its SE, n, extractor, per-sample and
    per-reference lists)."""
    extra = extra or {}
    return {f"{m}{p}": extra[f"{m}{p}"] for m in metrics if m in extra for p in DISTRIBUTION_PARTS
            if f"{m}{p}" in extra}  # fmt: skip


def skipped_jobs(session: Session, grid: Grid) -> dict[int, list[dict[str, Any]]]:
    """Per run id, each of the grid's evaluation jobs that was skipped (a diverged run's checkpoint that measures
    non-finite values: runs/evaluation_record.py diverged_skip), oldest first: the evaluation, the step, its
    images and the reason stored on the job. The dashboard shows them, so a run an evaluation left out is not
    read as measured (its effects use its own records)."""
    rows = session.execute(
        select(EvaluationResult.run_id, Evaluation.id, EvaluationResult.step, Evaluation.images, EvaluationResult.error)
        .join(Evaluation, Evaluation.id == EvaluationResult.evaluation_id)
        .where(Evaluation.grid_id == grid.id, EvaluationResult.state == EvaluationState.skipped)
        .order_by(Evaluation.id, EvaluationResult.id)
    ).all()  # fmt: skip
    out: dict[int, list[dict[str, Any]]] = {}
    for run_id, evaluation_id, step, images, error in rows:
        out.setdefault(run_id, []).append({"evaluation": evaluation_id, "step": step, "images": images,
                                           "reason": error or f"run {run_id}: skipped, no reason stored"})  # fmt: skip
    return out


def job_states(session: Session, grid_id: int) -> list[list[Any]]:
    """How many of the grid's evaluation jobs are in each state, as [state, count] pairs (the dashboard's
    version token: a job completed or skipped changes what the grid page shows)."""
    rows = session.execute(
        select(EvaluationResult.state, func.count()).join(Evaluation).where(Evaluation.grid_id == grid_id)
        .group_by(EvaluationResult.state).order_by(EvaluationResult.state)
    ).all()  # fmt: skip
    return [[state, count] for state, count in rows]
