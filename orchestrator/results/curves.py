"""Read per-checkpoint metric curves in the published fixture's schema:

    {arm_key: {"label": str, "checkpoints": [{"step": int, "recon_lpips": float, ...}, ...]}, ...}

Any subset of metrics may be present and extra keys are allowed (timestamps, sample counts).
Malformed input fails with one line naming the arm, the checkpoint and the field. Used by
`ablate replay`, `ablate import` and bench/compare_stoppers.py.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.runs.checkpoint import Checkpoint


class CurvesError(ValueError):
    """Malformed curves; the message names the arm, checkpoint and field."""


def _numeric_metric_fields() -> frozenset[str]:
    """The DB's numeric metric columns, the fixture's elapsed_hours and the distribution metrics with their SE and
    n (FID, CMMD, DINO-MMD in PRX's published curves): these must be numbers or null."""
    from model.spec import DISTRIBUTION_METRICS
    from orchestrator.db.models import Metric  # sqlalchemy only; keeps the schema the one source of names

    cols = {
        c.name
        for c in Metric.__table__.columns
        if c.name not in {"id", "run_id", "step"} and c.type.python_type in (int, float)
    }
    distribution = {f"{m}{part}" for m in DISTRIBUTION_METRICS for part in ("", "_se", "_n")}
    return frozenset(cols | distribution | {"elapsed_hours"})


@dataclass(frozen=True)
class Curve:
    arm: str
    label: str
    checkpoints: tuple[Checkpoint, ...]  # in step order
    raw: tuple[dict[str, Any], ...]  # the checkpoint dicts as read, in step order (for `ablate import`)


def parse_curves(data: Any, source: str = "curves") -> dict[str, Curve]:
    """Validate and convert a parsed curves document; arms keep the document's order."""
    if not isinstance(data, dict) or not data:
        raise CurvesError(f"{source}: expected a JSON object {{arm: {{'label', 'checkpoints'}}}} with at least one arm")
    numeric = _numeric_metric_fields()
    curves: dict[str, Curve] = {}
    for arm, body in data.items():
        where = f"{source}: arm {arm!r}"
        if not isinstance(body, dict):
            raise CurvesError(f"{where}: expected an object with 'checkpoints', got {type(body).__name__}")
        label = body.get("label", arm)
        if not isinstance(label, str):
            raise CurvesError(f"{where}: 'label' must be a string, got {label!r}")
        rows = body.get("checkpoints")
        if not isinstance(rows, list) or not rows:
            raise CurvesError(f"{where}: 'checkpoints' must be a non-empty list")
        checkpoints: list[tuple[Checkpoint, dict[str, Any]]] = []
        seen: set[int] = set()
        for i, row in enumerate(rows):
            at = f"{where}, checkpoint {i}"
            if not isinstance(row, dict):
                raise CurvesError(f"{at}: expected an object, got {type(row).__name__}")
            step = row.get("step")
            if isinstance(step, bool) or not isinstance(step, int | float) or not math.isfinite(step) or step < 0 \
                    or step != int(step):
                raise CurvesError(f"{at}: 'step' must be a non-negative integer, got {step!r}")
            at = f"{where}, checkpoint {i} (step {int(step)})"
            if int(step) in seen:
                raise CurvesError(f"{at}: duplicate step")
            seen.add(int(step))
            for key, val in row.items():
                if key in numeric and val is not None and (isinstance(val, bool) or not isinstance(val, int | float)):
                    raise CurvesError(f"{at}: field {key!r} must be a number or null, got {val!r}")
            checkpoints.append((Checkpoint.from_mapping(row), row))
        checkpoints.sort(key=lambda pair: pair[0].step)
        curves[arm] = Curve(
            arm=arm,
            label=label,
            checkpoints=tuple(cp for cp, _ in checkpoints),
            raw=tuple(row for _, row in checkpoints),
        )
    return curves


def load_curves(path: str | Path) -> dict[str, Curve]:
    """Read a curves JSON file (NaN/Infinity literals are accepted: they mean diverged)."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CurvesError(f"curves file {str(path)!r} not found") from None
    except OSError as exc:
        raise CurvesError(f"cannot read curves file {str(path)!r}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CurvesError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    return parse_curves(data, source=str(path))
