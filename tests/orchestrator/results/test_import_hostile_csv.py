"""`ablate import` of a hostile CSV (issue 63, not yet probed): a huge file, thousands of columns, cells and
names a spreadsheet would run as formulas, non-finite numbers. Each is refused in one line naming the file,
the line or column and the fix (exit code 2, no traceback) before anything is stored, or, for formulas,
stored inert: nothing already stored changes. Through the installed `ablate` command on the test's database."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from sqlalchemy import func, select

from orchestrator.dashboard.data import metrics_csv
from orchestrator.db.models import Event, Grid, Metric, Run
from orchestrator.db.session import session_scope
from orchestrator.runs.ingest import metric_series
from orchestrator.spreadsheet_text import FORMULA_START
from orchestrator.trackers.csv_table import MAX_CSV_BYTES, MAX_CSV_COLUMNS, MAX_CSV_ROWS, MAX_NAME_CHARS
from orchestrator.trackers.forwarder import scalars_of
from tests.kit.refusals import assert_refused_in_one_line

GOOD = "run,step,train_loss,recon_lpips\nA_base,100,0.9,0.5\nA_base,200,0.8,0.45\nB_tread,100,0.9,0.52\n"


def stored(database_url: str) -> tuple[int, int, int]:
    """(grids, runs, metric rows) in the database."""
    with session_scope(database_url) as s:
        return tuple(s.scalar(select(func.count()).select_from(t)) for t in (Grid, Run, Metric))  # type: ignore[return-value]


@pytest.fixture(scope="module")
def earlier(database_url: str, ablate_cli, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, int, int]:  # type: ignore[no-untyped-def]
    """A grid imported before the hostile files: what is stored, which none of them may change."""
    path = tmp_path_factory.mktemp("good") / "good.csv"
    path.write_text(GOOD)
    out = ablate_cli(database_url, "import", str(path), "--name", "earlier")
    assert out.returncode == 0, out.stderr
    return stored(database_url)


def hostile(tmp_path: Path, kind: str) -> tuple[Path, str]:
    """A hostile CSV of `kind` and what its refusal must say."""
    path = tmp_path / f"{kind}.csv"
    if kind == "huge":  # valid rows, then blank lines past the size cap (csv skips blank lines)
        with path.open("w") as fh:
            fh.write(GOOD)
            fh.write("\n" * (MAX_CSV_BYTES + 1))
        return path, f"more than the {MAX_CSV_BYTES} an import reads; keep every Nth step"
    if kind == "rows":
        body = "".join(f"A_base,{s},0.5\n" for s in range(MAX_CSV_ROWS + 1))
        path.write_text("run,step,train_loss\n" + body)
        return path, f"more than {MAX_CSV_ROWS} rows; keep every Nth step"
    if kind == "columns":
        names = [f"m{i}" for i in range(5000)]
        path.write_text("run,step," + ",".join(names) + "\nA_base,100," + ",".join("0.5" for _ in names) + "\n")
        return path, f"5002 columns, more than the {MAX_CSV_COLUMNS} an import reads"
    if kind == "long name":
        path.write_text("run,step," + "x" * 100_000 + "\nA_base,100,0.5\n")
        return path, "line 1: a column name of 100000 characters ('xxx"
    if kind == "long run":
        path.write_text("run,step,train_loss\n" + "A" * 5000 + ",100,0.5\n")
        return path, "line 2: a run name of 5000 characters ('AAA"
    if kind == "nan past comments":  # the line named is the file's, its leading # lines counted
        path.write_text("# curves as published\n# by a study\nrun,step,train_loss\nA_base,100,0.9\n\nA_base,200,NaN\n")
        return path, "line 6, column 'train_loss': 'NaN' is not a finite number"
    cell = {"nan": "nan", "inf": "inf", "-inf": "-Infinity", "overflow": "1e999"}[kind]
    path.write_text(f"run,step,train_loss,recon_lpips\nA_base,100,0.9,0.5\nA_base,200,0.8,{cell}\n")
    return path, f"line 3, column 'recon_lpips': '{cell}' is not a finite number; leave the cell empty"


HOSTILE = ["huge", "rows", "columns", "long name", "long run", "nan", "inf", "-inf", "overflow", "nan past comments"]


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_hostile_csv_is_refused_in_one_line_and_nothing_stored_changes(
    database_url: str, ablate_cli, earlier: tuple[int, int, int], tmp_path: Path, kind: str  # type: ignore[no-untyped-def]
) -> None:
    path, said = hostile(tmp_path, kind)
    out = ablate_cli(database_url, "import", str(path), "--name", kind)
    assert_refused_in_one_line(out, path, said)
    assert stored(database_url) == earlier


def test_a_csv_at_the_caps_imports(database_url: str, ablate_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The caps refuse only what is past them: MAX_CSV_COLUMNS columns with names of MAX_NAME_CHARS import."""
    names = [f"m{i}".ljust(MAX_NAME_CHARS, "_") for i in range(MAX_CSV_COLUMNS - 2)]
    path = tmp_path / "wide.csv"
    path.write_text("run,step," + ",".join(names) + "\nA_base,100," + ",".join("0.5" for _ in names) + "\n")
    out = ablate_cli(database_url, "import", str(path), "--name", "at the caps")
    assert out.returncode == 0, out.stderr[-2000:]


FORMULA_COLUMNS = '"=HYPERLINK(""http://evil.example/x"",""click"")",@SUM(1),+1,-1,train_loss'


def import_formulas(database_url: str, ablate_cli, tmp_path: Path, run: str, *arm: str) -> int:  # type: ignore[no-untyped-def]
    """Two checkpoints of `run` under metric columns a spreadsheet would run; the new grid's id."""
    path = tmp_path / "formula.csv"
    path.write_text(f'run,step,{FORMULA_COLUMNS}\n"{run}",100,0.3,0.4,0.5,0.6,0.9\n"{run}",200,0.2,0.4,0.5,0.6,0.8\n')
    out = ablate_cli(database_url, "import", str(path), "--name", "formulas", *arm)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[1])


def test_formula_metric_names_are_stored_inert(database_url: str, ablate_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Metric columns named `=HYPERLINK(...)`, `@SUM(1)`, `+1` and `-1` are stored with a leading ' wherever they
    reach the trackers' chart names (and so their own CSV exports) and the dashboard's CSV export; the numbers
    are kept."""
    grid_id = import_formulas(database_url, ablate_cli, tmp_path, "A_base")
    with session_scope(database_url) as s:
        grid = s.get(Grid, grid_id)
        assert grid is not None
        (a,) = grid.runs
        series = metric_series(s, a.id)
        names = set(scalars_of(series[-1], "train_loss"))  # what a tracker charts
        assert {"'=HYPERLINK(\"http://evil.example/x\",\"click\")", "'@SUM(1)", "'+1", "'-1"} <= names, names
        assert series[-1]["'@SUM(1)"] == 0.4 and series[-1]["train_loss"] == 0.8
        assert not [n for n in names if n.startswith(FORMULA_START)], names
        exported = metrics_csv(s, grid)
    cells = [cell for row in list(csv.reader(io.StringIO(exported)))[1:] for cell in row]
    assert not [c for c in cells if c.startswith(FORMULA_START)], exported


def test_a_formula_run_name_is_mapped_and_stored_inert(database_url: str, ablate_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A run named `=cmd|...` maps to arm A with `--arm` (the letter follows the last `=`: the first split the
    key off empty) and its name reaches the import's event, forwarded to the trackers, with a leading '."""
    run = "=cmd|' /C calc'!A0"
    grid_id = import_formulas(database_url, ablate_cli, tmp_path, run, "--arm", f"{run}=A")
    with session_scope(database_url) as s:
        (a,) = s.scalars(select(Run).where(Run.grid_id == grid_id)).all()
        (event,) = s.scalars(select(Event).where(Event.run_id == a.id, Event.kind == "imported")).all()
        inert = "'" + run
        assert event.data["label"] == inert and event.data["key"] == inert and f"of {inert!r}" in event.message
