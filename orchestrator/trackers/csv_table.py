"""A CSV file for `ablate import`, read within caps, and its cells read as finite numbers.

A hostile or mistaken file is refused before anything is stored, in one line naming the file, the line
and the column and saying what to do: past MAX_CSV_BYTES (a 60 MB file took 55 s and 2.8 GB to parse
before its 2.6 million rows were stored), past MAX_CSV_COLUMNS (each column is a metric of every stored
checkpoint and a chart in every tracker), past MAX_CSV_ROWS, a column or run name past MAX_NAME_CHARS,
or a cell that is a non-finite number (`nan`, `inf`, `1e999`): a CSV has no way to say a value is missing
but an empty cell, so a non-finite one is refused rather than stored as a measurement.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchestrator.results.curves import CurvesError

MAX_CSV_BYTES = 32 << 20  # a W&B history of 100,000 logged steps and 30 metrics is about this size
MAX_CSV_COLUMNS = 1000
MAX_CSV_ROWS = 100_000
MAX_NAME_CHARS = 200  # a column's (a metric's, or a chart's "<run> - <metric>") or a run's name


class _Uncommented:
    """The lines of a CSV file past its leading `#` comment lines (a fixture saying where its format comes
    from), counting those it skipped: a row's line in the file is csv's line count plus them."""

    def __init__(self, fh: Iterator[str]) -> None:
        self.fh, self.skipped, self.header_seen = fh, 0, False

    def __iter__(self) -> Iterator[str]:
        for line in self.fh:
            if self.header_seen or not line.startswith("#"):
                self.header_seen = True
                yield line
            else:
                self.skipped += 1


def read_csv_table(path: Path) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    """The file's column names and its rows, each with its line in the file (where the row ends), within
    the caps; CurvesError naming what is past one, or a file csv cannot read (a field past its limit, bytes
    that are not text)."""
    size = path.stat().st_size
    if size > MAX_CSV_BYTES:
        raise CurvesError(f"{path}: {size} bytes, more than the {MAX_CSV_BYTES} an import reads; keep every Nth step "
                          "or split it into one file per run")  # fmt: skip
    try:
        with path.open(newline="") as fh:
            lines = _Uncommented(fh)
            reader = csv.DictReader(lines)
            columns = list(reader.fieldnames or [])
            if len(columns) > MAX_CSV_COLUMNS:
                raise CurvesError(f"{path}: {len(columns)} columns, more than the {MAX_CSV_COLUMNS} an import reads; "
                                  "keep the metrics the study compares")  # fmt: skip
            for column in columns:
                if len(column) > MAX_NAME_CHARS:
                    raise CurvesError(f"{path}: line {lines.skipped + 1}: a column name of {len(column)} characters "
                                      f"({column[:40]!r}...), more than {MAX_NAME_CHARS}; rename it")  # fmt: skip
            rows = []
            for row in reader:
                if len(rows) == MAX_CSV_ROWS:
                    raise CurvesError(f"{path}: more than {MAX_CSV_ROWS} rows; keep every Nth step or split it "
                                      "into one file per run")  # fmt: skip
                rows.append((reader.line_num + lines.skipped, row))
    except (csv.Error, UnicodeDecodeError) as exc:
        raise CurvesError(f"{path}: not a readable CSV file: {exc}"[:2000]) from None
    return columns, rows


def finite_cell(path: Path, n: int, column: str, cell: Any) -> float | None:  # noqa: ANN401 - a CSV cell
    """The cell in `column` of the row on line `n` as a number: None where it is empty or not a number (text
    is no metric); CurvesError naming the line and column where it is a non-finite number."""
    if not isinstance(cell, str) or not cell.strip():
        return None
    try:
        value = float(cell)
    except ValueError:
        return None
    if not math.isfinite(value):
        raise CurvesError(f"{path}: line {n}, column {column[:MAX_NAME_CHARS]!r}: {cell[:40]!r} is not a finite "
                          "number; leave the cell empty where there is no value")  # fmt: skip
    return value


def checked_name(path: Path, n: int, name: str) -> str:
    """A run's name from the row on line `n` (its `run` column), within MAX_NAME_CHARS; CurvesError naming the
    line else."""
    if len(name) > MAX_NAME_CHARS:
        raise CurvesError(f"{path}: line {n}: a run name of {len(name)} characters ({name[:40]!r}...), more "
                          f"than {MAX_NAME_CHARS}; name the run after its arm (A_baseline)")  # fmt: skip
    return name
