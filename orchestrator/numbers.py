"""Non-finite numbers (NaN/Inf: a diverged loss or metric) where they meet JSON and the database.

Postgres JSON rejects the NaN/Infinity tokens and SQLite stores a NaN float as NULL, so a value that
must survive a round trip is kept as its string ("nan", "inf", "-inf"); a value only shown is sent as
null (the run's decision says why).
"""

from __future__ import annotations

import math
from typing import Any


def is_finite(x: object) -> bool:
    """A number that is neither None nor NaN/Inf; anything else (the text "nan" a record stores) is not."""
    return isinstance(x, int | float) and math.isfinite(x)


def finite_or_none(x: float | None) -> float | None:
    """The value itself when finite, else None (JSON for display has no NaN/Inf)."""
    return x if is_finite(x) else None


def json_safe(value: Any) -> Any:
    """A non-finite float as its string ("nan", "inf"), which float() reads back; anything else as it is."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def number(value: object, spec: str = ".4g") -> str:
    """A number as text: "-" for None, a float by `spec` (".3f", ".1e"), anything else as it is (a step,
    a name, a non-finite metric stored as "nan"). The tables and the reports write numbers with it."""
    if value is None:
        return "-"
    return format(value, spec) if isinstance(value, float) else str(value)


SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def readable(value: float, digits: int = 4) -> str:
    """A small probability or cost as a reader reads it: "0.0123", "0.000803", and below 0.0001
    "8.03 × 10⁻⁸" rather than Python's "8.03e-08"."""
    if value == 0 or not math.isfinite(value) or abs(value) >= 1e-4:
        return format(value, f".{digits}g")
    mantissa, exponent = format(value, f".{min(digits, 3) - 1}e").split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa} × 10{str(int(exponent)).translate(SUPERSCRIPT)}"


def estimate(value: float) -> str:
    """A projection's size without false precision and never rounded to nothing: one decimal from 10 up
    ("41.2"), else two significant digits ("3.2", "0.0023", "5.7 × 10⁻⁶"): a tiny grid's GPU-hours do not
    read "0.0"."""
    if value >= 10:
        return f"{value:,.1f}"
    return readable(value, 2)
