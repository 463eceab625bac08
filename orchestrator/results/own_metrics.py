"""A command arm's own metrics: every number its script reports besides `step`, by the script's names
(those ablate has a column for, such as train_loss, and the rest, kept in Metric.extra), as series for
the dashboard's charts and the report's curves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.db.models import METRIC_FIELDS, Metric, Run
from worker.protocol import NONFINITE_TEXT

# Keys ablate itself puts on a command arm's record (worker/command.py) or row: not the script's metrics.
ABLATE_KEYS = frozenset({
    "run_id", "checkpoint", "checkpoint_file", "is_best", "best_step", "best_checkpoint", "samples", "nonfinite",
    "wall_time_s", "gpu_hours", "lpips_backbone",
})  # fmt: skip


def is_command_run(run: Run) -> bool:
    return bool((run.spec or {}).get("command"))


def _value(value: Any) -> float | None | bool:
    """The point of a series (None: NaN/inf, drawn as a gap), or False for what is not a number."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return float(value) if value == value and abs(value) != float("inf") else None
    return None if value in NONFINITE_TEXT else False


def own_series(metrics: Sequence[Metric]) -> dict[str, list[float | None]]:
    """{metric name: one value per checkpoint (None where it is missing or not finite)}, names in the order
    the script first reported them; a name that never held a number is left out."""
    rows: list[dict[str, float | None]] = []
    names: dict[str, None] = {}
    for m in metrics:
        row: dict[str, float | None] = {}
        fields = {name: getattr(m, name) for name in METRIC_FIELDS}
        for key, raw in [*fields.items(), *(m.extra or {}).items()]:
            if key in ABLATE_KEYS or raw is None:
                continue
            value = _value(raw)
            if value is not False:
                row[key] = value  # type: ignore[assignment]
                names.setdefault(key)
        kept = (m.extra or {}).get("nonfinite")
        for key in kept if isinstance(kept, dict) else ():  # ingest's own (a node's was refused: protocol)
            row[key] = None  # a column's NaN (SQLite stores it as NULL): a gap, as in the detector's eyes
            names.setdefault(key)
        rows.append(row)
    return {name: [row.get(name) for row in rows] for name in names}


def own_evaluated(m: Metric) -> list[str]:
    """A command arm's own metrics that its record measured on held-out items: a number reported beside its
    per-item list `<name>_samples` or its standard error `<name>_se`. The report compares arms on these
    (paired, across seeds, crossed where every seed reports the same items), as on the built-in metrics."""
    extra = m.extra or {}
    return [name for name, value in extra.items()
            if name not in ABLATE_KEYS and _value(value) is not False
            and (isinstance(extra.get(f"{name}_samples"), list) or f"{name}_se" in extra)]  # fmt: skip
