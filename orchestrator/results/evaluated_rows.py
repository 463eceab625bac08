"""The row the report reads at each of a run's checkpoints: the training record's, the largest completed
evaluation's where it measured that checkpoint (the same images and noise for every run), and on either the
distribution metrics (CMMD, DINO-MMD, FD-DINOv2) of the evaluation that generated the most samples for that
checkpoint, else the training pass's. An evaluation that measured no distribution metric keeps the training
record's, so evaluating more images never drops them; one that measured the flow loss alone (a deciding grid's
look) keeps the training record's LPIPS metrics the same way, each on its own images. The rows are wrapped,
never changed: they are the database's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.db.models import EvaluationResult, Metric
from orchestrator.grids.evaluations import LPIPS_METRICS
from orchestrator.results.evaluations import distribution_keys
from orchestrator.results.reports.stats import DISTRIBUTION


class Overlaid:
    """A row with other rows' distribution metrics in its `extra` (and `columns`: the training row's LPIPS
    metrics under an evaluation that did not measure them); every other attribute is the row's own."""

    def __init__(self, row: Any, extra: dict[str, Any], columns: dict[str, Any] | None = None) -> None:
        self._row, self.extra = row, extra
        for name, value in (columns or {}).items():
            setattr(self, name, value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._row, name)


def _n(extra: dict[str, Any] | None, metric: str) -> int:
    n = (extra or {}).get(f"{metric}_n")
    return n if isinstance(n, int) and not isinstance(n, bool) else 0


def _lpips_under(row: Any, under: Any, extra: dict[str, Any]) -> dict[str, Any]:
    """The columns of `under`'s LPIPS metrics that `row` (an evaluation of the flow loss alone) did not
    measure, their per-sample lists and notes put in `extra`: each metric keeps its own n, so the report reads
    them on the training record's images and the flow loss on the evaluation's."""
    columns: dict[str, Any] = {}
    if under is None:
        return columns
    for m in LPIPS_METRICS:
        if getattr(row, m, None) is not None or getattr(row, f"{m}_n", None) is not None:
            continue
        columns |= {k: getattr(under, k, None) for k in (m, f"{m}_se", f"{m}_n")}
        for key in (f"{m}_samples", *(("text_manip_note",) if m == "text_manip_delta" else ())):
            if key in (under.extra or {}):
                extra[key] = under.extra[key]
    if columns and getattr(row, "lpips_backbone", None) is None:
        columns["lpips_backbone"] = getattr(under, "lpips_backbone", None)
    return columns


def _overlay(row: Any, under: Any = None, over: Sequence[Any] = ()) -> Any:
    """`row` with the distribution metrics of `under` it did not measure (and its LPIPS metrics, where the
    row is an evaluation of the flow loss alone), then each of `over`'s (fewest samples first) that measured a
    metric on at least as many samples as the row now has."""
    extra = dict(row.extra or {})
    unmeasured = tuple(m for m in DISTRIBUTION if m not in extra)
    extra |= distribution_keys(getattr(under, "extra", None), unmeasured)
    columns = _lpips_under(row, under, extra)
    for other in over:
        more = tuple(m for m in DISTRIBUTION if m in (other.extra or {}) and _n(other.extra, m) >= _n(extra, m))
        extra |= distribution_keys(other.extra, more)
    return row if extra == (row.extra or {}) and not columns else Overlaid(row, extra, columns)


def with_evaluation(metrics: dict[int, list[Metric]], evaluated: dict[int, EvaluationResult],
                    distribution: dict[int, list[EvaluationResult]] | None = None) -> dict[int, list]:  # fmt: skip
    """Each run's checkpoint rows with its evaluated checkpoint's row in place of the training row of that
    step, so a comparison at that step pairs two evaluation rows; `distribution` (evaluations.py
    distribution_evaluations) puts its rows' distribution metrics on the rows of their steps."""
    out: dict[int, list] = {}
    for run_id, rows in metrics.items():
        row = evaluated.get(run_id)
        merged: list[Any] = list(rows)
        if row is not None:
            trained = next((m for m in rows if m.step == row.step), None)
            merged = sorted([*(m for m in rows if m.step != row.step), _overlay(row, under=trained)],
                            key=lambda m: m.step)  # fmt: skip
        extra = (distribution or {}).get(run_id, [])
        out[run_id] = [_overlay(m, over=[e for e in extra if e.step == m.step]) for m in merged]
    return out


def at_step(rows: list[Any], point: Any) -> Any:
    """The row of `rows` (with_evaluation's) at `point`'s step, else `point` itself."""
    return None if point is None else next((m for m in rows if m.step == point.step), point)


def evaluated_points(rows: list, best: Metric | None, final: Metric | EvaluationResult | None) -> list[tuple[str, Any]]:
    """The report's ("best", row) and ("final", row), each the row of `rows` (with_evaluation's) at its
    step: the evaluation's where it measured that step."""
    return [("best", at_step(rows, best)), ("final", at_step(rows, final))]
