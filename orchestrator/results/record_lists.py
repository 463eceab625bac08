"""A stored record's list fields (per sample, per timestep, skipped files) read as the node protocol
declares them (worker/protocol.py LIST_SHAPES).

Ingest checks these lists since the protocol declares them, but a record stored before, or an imported
one, may hold anything there: text, a number, a ragged grid, a non-finite value as its text ("nan").
A reader takes a list only where it has its declared shape, its numbers as floats (the text of a
non-finite one read as that non-finite float, never formatted as a number), and `unreadable` says which
list a record was left out for, so one bad record never fails a page.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

from worker.protocol import LIST_SHAPES, first_error


@cache
def _adapter(key: str) -> TypeAdapter[Any]:
    shape = LIST_SHAPES.get(key)
    if shape is None and key.endswith("_samples"):  # a command arm's own per-sample list
        shape = LIST_SHAPES["val_flow_loss_samples"]
    return TypeAdapter(shape, config=ConfigDict(strict=True))


def _floats(value: Any) -> Any:
    """Numbers as floats, the text of a non-finite one ("nan", "inf", "-inf") as that float; rows too."""
    if isinstance(value, list):
        return [_floats(v) for v in value]
    return float(value) if isinstance(value, int | float | str) and not isinstance(value, bool) else value


def _checked(extra: dict[str, Any] | None, key: str) -> tuple[list[Any] | None, str | None]:
    value = (extra or {}).get(key) if isinstance(extra, dict) else None
    if value is None:
        return None, None
    try:
        return _adapter(key).validate_python(value), None
    except ValidationError as exc:
        return None, first_error(exc).removeprefix("the value: ")


def stored_list(extra: dict[str, Any] | None, key: str) -> list[Any] | None:
    """extra[key] in its declared shape, numbers as floats (NaN and infinities included); None where it
    is missing or has another shape. skipped_files stays a list of names."""
    value, _ = _checked(extra, key)
    if value is None:
        return None
    return value if key == "skipped_files" else _floats(value)


def unreadable(extra: dict[str, Any] | None) -> list[str]:
    """Why each list field of a stored record that is not in its declared shape is left out, e.g.
    "val_flow_loss_grid: Input should be a valid list"."""
    keys = [k for k in (extra or {}) if k in LIST_SHAPES or k.endswith("_samples")] if isinstance(extra, dict) else []
    return [f"{key}: {why}" for key in keys if (why := _checked(extra, key)[1]) is not None]


SHOWN = 20  # records named on a page; the rest are counted


def unreadable_records(records: list[tuple[str, int, dict[str, Any] | None]]) -> list[str]:
    """Each stored record with a list left out, named, from (run label, step, extra) triples: "run 7 (C,
    seed 0) step 400: val_flow_loss_grid: Input should be a valid list". The first SHOWN, then a count."""
    found = [f"{run} step {step}: {why}" for run, step, extra in records for why in unreadable(extra)]
    more = [f"and {len(found) - SHOWN} more"] if len(found) > SHOWN else []
    return found[:SHOWN] + more
