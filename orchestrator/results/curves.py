"""Read per-checkpoint metric curves in the published fixture's schema:

    {arm_key: {"label": str, "checkpoints": [{"step": int, "recon_lpips": float, ...}, ...]}, ...}

Any subset of metrics may be present and extra keys are allowed (timestamps, sample counts).
Malformed input fails with one line naming the arm, the checkpoint and the field. Used by
`ablate replay`, `ablate import` (of this JSON and of every tracker export, trackers/exports.py) and
bench/compare_stoppers.py.

A metric's value may be NaN or +-Infinity: that is how a run that diverged records it, and the detector
replayed over the curves stops the arm as `diverged` there (the value is kept, ingest.metric_values). What
the import counts with may not be: a checkpoint's step, its hours (`elapsed_hours`, `gpu_hours`,
`wall_time_s`) and its counts (`*_n`, `num_*_samples`) must be finite, in range numbers (an `elapsed_hours`
of Infinity was a traceback, an `_n` of 1e300 "integer out of range" naming no field). A document is read
within the caps the CSV import has (trackers/csv_table.py): MAX_CURVES_BYTES of JSON, MAX_CHECKPOINTS
checkpoints over all arms, MAX_FIELDS distinct fields and MAX_NAME_CHARS of a field's or an arm's name.
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


MAX_CURVES_BYTES = 32 << 20  # as a CSV's: json.loads holds all of it, several times its size, in memory
MAX_CHECKPOINTS = 100_000  # over all arms: each is a stored row, a point of every chart and tracker
MAX_FIELDS = 1000  # distinct fields over all checkpoints: each a metric, a chart in every tracker
MAX_NAME_CHARS = 200  # a field's or an arm's name
MAX_INT = 2**31 - 1  # a step or a count is an INTEGER column
MAX_HOURS = 1e6  # one arm's hours: its end is its start plus them (a datetime)
HOURS = {"elapsed_hours": 1.0, "gpu_hours": 1.0, "wall_time_s": 3600.0}  # each field's units per hour


def _count_fields() -> frozenset[str]:
    """The fields that count something (stored as integers): the DB's `_n` columns, the fixture's names for
    two of them, and each distribution metric's `_n`."""
    from model.spec import DISTRIBUTION_METRICS
    from orchestrator.db.models import Metric

    cols = {c.name for c in Metric.__table__.columns if c.name.endswith("_n") and c.type.python_type is int}
    return frozenset(cols | {"num_recon_samples", "num_text_samples"} | {f"{m}_n" for m in DISTRIBUTION_METRICS})


def _checked_value(at: str, key: str, val: Any, counts: frozenset[str]) -> None:  # noqa: ANN401 - a JSON value
    """CurvesError naming the field and the fix where a number is past what a float holds (a JSON integer of
    400 digits), or an hours or count field is not a number in its range."""
    if isinstance(val, int) and not isinstance(val, bool) and abs(val) > 1e308:
        raise CurvesError(f"{at}: field {key!r} is a number of {len(str(abs(val)))} digits, past what a float "
                          "holds; write it in exponent form (1e30) or leave it out")  # fmt: skip
    if val is None or (key not in HOURS and key not in counts):
        return
    number = isinstance(val, int | float) and not isinstance(val, bool) and math.isfinite(val)
    if key in HOURS and not (number and 0 <= val <= MAX_HOURS * HOURS[key]):
        raise CurvesError(f"{at}: field {key!r} must be a finite number from 0 to {MAX_HOURS * HOURS[key]:g}, got "
                          f"{str(val)[:40]!r}; leave it out (or null) where the time is unknown")  # fmt: skip
    if key in counts and not (number and val == int(val) and 0 <= val <= MAX_INT):
        raise CurvesError(f"{at}: field {key!r} is a count and must be a whole number from 0 to {MAX_INT}, got "
                          f"{str(val)[:40]!r}; leave it out (or null) where it is unknown")  # fmt: skip


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
    numeric, counts = _numeric_metric_fields(), _count_fields()
    curves: dict[str, Curve] = {}
    total, fields = 0, set()
    for arm, body in data.items():
        where = f"{source}: arm {arm[:40]!r}"
        if len(arm) > MAX_NAME_CHARS:
            raise CurvesError(f"{where}...: a name of {len(arm)} characters, more than {MAX_NAME_CHARS}; name the "
                              "curve after its arm (A_baseline)")  # fmt: skip
        if not isinstance(body, dict):
            raise CurvesError(f"{where}: expected an object with 'checkpoints', got {type(body).__name__}")
        label = body.get("label", arm)
        if not isinstance(label, str) or len(label) > MAX_NAME_CHARS:
            raise CurvesError(f"{where}: 'label' must be a string of at most {MAX_NAME_CHARS} characters, got "
                              f"{str(label)[:40]!r}")  # fmt: skip
        rows = body.get("checkpoints")
        if not isinstance(rows, list) or not rows:
            raise CurvesError(f"{where}: 'checkpoints' must be a non-empty list")
        total += len(rows)
        if total > MAX_CHECKPOINTS:
            raise CurvesError(f"{where}: more than {MAX_CHECKPOINTS} checkpoints over all arms, more than an import "
                              "reads; keep every Nth step (a W&B or TensorBoard run that logged every step: export "
                              "its history as a CSV of every Nth step)")  # fmt: skip
        checkpoints: list[tuple[Checkpoint, dict[str, Any]]] = []
        seen: set[int] = set()
        for i, row in enumerate(rows):
            at = f"{where}, checkpoint {i}"
            if not isinstance(row, dict):
                raise CurvesError(f"{at}: expected an object, got {type(row).__name__}")
            step = row.get("step")
            if isinstance(step, bool) or not isinstance(step, int | float) or not -1 < step <= MAX_INT \
                    or step != int(step):  # NaN compares false, inf is past MAX_INT
                raise CurvesError(f"{at}: 'step' must be a non-negative integer, got {repr(step)[:40]} "
                                  f"(at most {MAX_INT})")  # fmt: skip
            at = f"{where}, checkpoint {i} (step {int(step)})"
            if int(step) in seen:
                raise CurvesError(f"{at}: duplicate step")
            seen.add(int(step))
            for key, val in row.items():
                if key not in fields:
                    if len(key) > MAX_NAME_CHARS:
                        raise CurvesError(f"{at}: a field name of {len(key)} characters ({key[:40]!r}...), more "
                                          f"than {MAX_NAME_CHARS}; rename it")  # fmt: skip
                    fields.add(key)
                    if len(fields) > MAX_FIELDS:
                        raise CurvesError(f"{at}: more than {MAX_FIELDS} distinct fields, more than an import "
                                          "reads; keep the metrics the study compares")  # fmt: skip
                if key in numeric and val is not None and (isinstance(val, bool) or not isinstance(val, int | float)):
                    raise CurvesError(f"{at}: field {key!r} must be a number or null, got {str(val)[:40]!r}")
                _checked_value(at, key, val, counts)
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
        size = path.stat().st_size
        if size > MAX_CURVES_BYTES:
            raise CurvesError(f"{path}: {size} bytes, more than the {MAX_CURVES_BYTES} an import reads; keep every "
                              "Nth step")  # fmt: skip
        text = path.read_text()
    except FileNotFoundError:
        raise CurvesError(f"curves file {str(path)!r} not found") from None
    except OSError as exc:
        raise CurvesError(f"cannot read curves file {str(path)!r}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CurvesError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError:  # an integer of more than Python's 4300 digits
        raise CurvesError(f"{path}: a number of more than 4300 digits, past what an import reads; write it in "
                          "exponent form (1e30) or leave it out") from None  # fmt: skip
    except RecursionError:
        raise CurvesError(f"{path}: arrays or objects nested deeper than an import reads; a checkpoint's values "
                          "are numbers, text or flat lists") from None  # fmt: skip
    return parse_curves(data, source=str(path))
