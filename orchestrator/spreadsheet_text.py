"""Text a spreadsheet would run as a formula, made inert: the dashboard's CSV export and `ablate import` (whose
curve names and metric names reach that export, the trackers' charts and their own CSV exports) use one rule."""

from __future__ import annotations

from typing import Any

# A cell starting with one of these is a formula to Excel, LibreOffice and Google Sheets
# (OWASP "CSV injection"): `=HYPERLINK(...)` in a grid name would be live in the exported sheet.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_safe(value: Any) -> Any:  # noqa: ANN401 - a cell: text or a number
    """Text that a spreadsheet would run as a formula, prefixed with ' so it stays text; numbers as they are."""
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value
