"""A grid's evaluations (its stored checkpoints evaluated again on more held-out images) as views, and the
largest completed one, whose per-run rows the report's effects use in place of the training records'.

An `EvaluationResult` row carries the same metric columns, `extra` and `step` as a `Metric` row, so the
report's statistics read it unchanged.
"""

from __future__ import annotations

from typing import Any, Self

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Evaluation, EvaluationResult, Grid, Metric
from orchestrator.results.reports.model import EvaluationUsed
from orchestrator.results.views import MetricValues, Public, UTCDatetime
from orchestrator.vocabulary import EvaluationState


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
    runs: list[EvaluationRun]

    @classmethod
    def from_row(cls, evaluation: Evaluation) -> Self:
        runs = [EvaluationRun.model_validate(r) for r in evaluation.results]
        cost = sum(r.gpu_seconds or 0.0 for r in evaluation.results)
        return cls(
            id=evaluation.id, grid_id=evaluation.grid_id, images=evaluation.images, step=evaluation.step,
            state=evaluation.state, error=evaluation.error, created_at=evaluation.created_at,
            finished_at=evaluation.finished_at, gpu_seconds=cost, runs=runs,
        )  # fmt: skip


def largest_evaluation(session: Session, grid: Grid) -> tuple[EvaluationUsed | None, dict[int, EvaluationResult]]:
    """The grid's completed evaluation with the most images (the newest of equals) and its row per run id;
    (None, {}) when the grid has none."""
    found = session.scalars(
        select(Evaluation)
        .where(Evaluation.grid_id == grid.id, Evaluation.state == EvaluationState.completed)
        .order_by(Evaluation.images.desc(), Evaluation.id.desc())
        .limit(1)
    ).first()
    if found is None:
        return None, {}
    info = EvaluationUsed(id=found.id, images=found.images, step=found.step)
    return info, {r.run_id: r for r in found.results if r.state == EvaluationState.completed}


def with_evaluation(metrics: dict[int, list[Metric]], evaluated: dict[int, EvaluationResult]) -> dict[int, list]:
    """Each run's checkpoint rows with its evaluated checkpoint's row in place of the training row of that
    step, so a comparison at that step pairs two evaluation rows (the same images, the same noise)."""
    out: dict[int, list] = {}
    for run_id, rows in metrics.items():
        row = evaluated.get(run_id)
        kept = [m for m in rows if row is None or m.step != row.step]
        out[run_id] = sorted([*kept, row], key=lambda m: m.step) if row is not None else kept
    return out


def evaluated_points(rows: list, best: Metric | None, final: Metric | EvaluationResult | None) -> list[tuple[str, Any]]:
    """The report's ("best", row) and ("final", row), each the row of `rows` (with_evaluation's) at its
    step: the evaluation's where it measured that step."""

    def at(point: Any) -> Any:
        return None if point is None else next((m for m in rows if m.step == point.step), point)

    return [("best", at(best)), ("final", at(final))]
