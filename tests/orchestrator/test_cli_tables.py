"""The CLI's tables at any width: whole columns give way on a narrow terminal, and a file or pipe gets
every column with every cell whole; the one number formatter of their cells; the one free-port check."""

from __future__ import annotations

import io
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from orchestrator.cli import free_port
from orchestrator.cli.tables import Column, print_table
from orchestrator.numbers import number
from tests.kit.net import controller_for

COLUMNS = [
    Column("arm"),
    Column("state / decision"),
    Column("GPU", priority=3),
    Column("best recon LPIPS ± SE", short="best ± SE"),
    Column("iter/s", priority=2),
    Column("CPU-h saved", priority=1, short="saved"),
]
ROWS = [
    ["A", "completed / continue", "0", "0.048 ± 0.009", "9.0", "-"],
    ["A-lr5e-2", "stopped / collapse @200", "4", "0.069 ± 0.012", "9.0", "0.0056 (20 s)"],
]


def _render(console: Console) -> str:
    print_table("demo", COLUMNS, ROWS, console)
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_narrow_terminal_hides_whole_columns_never_cell_text() -> None:
    out = _render(Console(file=io.StringIO(), width=72, force_terminal=True, color_system=None))
    assert max(len(line) for line in out.splitlines()) <= 72
    for cell in ("A-lr5e-2", "stopped / collapse @200", "0.069 ± 0.012", "completed / continue"):
        assert cell in out, f"{cell!r} was cut:\n{out}"
    assert "…" not in out
    # The lowest priority goes first: GPU (3) and iter/s (2) are hidden, and the caption says so.
    assert "hidden on this narrow terminal: GPU, iter/s" in out.replace("\n", " ")


def test_wide_terminal_shows_every_column() -> None:
    out = _render(Console(file=io.StringIO(), width=200, force_terminal=True, color_system=None))
    assert "CPU-h saved" in out and "iter/s" in out and "GPU" in out and "hidden" not in out


def test_a_file_gets_the_whole_table_whatever_the_width() -> None:
    out = _render(Console(file=io.StringIO(), width=40))  # not a terminal
    assert "hidden" not in out and "…" not in out
    for cell in ("0.0056 (20 s)", "stopped / collapse @200", "best recon LPIPS ± SE", "CPU-h saved"):
        assert cell in out
    assert len({len(line) for line in out.splitlines()[1:]}) == 1, "every row of the table on one line"


def test_a_soft_wrapping_terminal_gets_the_caption_wrapped_by_words_and_a_column_back_where_it_fits() -> None:
    # The demo's console soft-wraps (its lines into a file stay whole): the caption naming the hidden columns
    # was printed on one 186-character line, for the terminal to break mid-word.
    columns = [Column("arm"), Column("GPU", priority=4), Column("state / decision"),
               Column("first held-out flow loss (weighted headline)", priority=2, short="first"),
               Column("best held-out flow loss (weighted headline) ± SE", short="best ± SE"),
               Column("@ step"), Column("final held-out flow loss (weighted headline)", priority=1, short="final"),
               Column("iter/s", priority=3), Column("CPU-h saved", priority=5, short="saved")]  # fmt: skip
    rows = [["A", "0", "completed", "1.234 @50", "0.234 ± 0.012", "400", "0.234", "9.0", "-"],
            ["A-lr500x", "4", "stopped / diverged @150", "1.234 @50", "0.913 ± 0.012", "100", "nan", "9.0",
             "0.0056 (20 s)"]]  # fmt: skip
    console = Console(file=io.StringIO(), width=80, soft_wrap=True, force_terminal=True, color_system=None)
    print_table("ablate demo: result per arm", columns, rows, console)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert max(len(line) for line in out.splitlines()) <= 80, out
    caption = " ".join(out.split("└")[1].split("\n", 1)[1].split())
    assert caption.startswith("hidden on this narrow terminal: GPU, first held-out flow loss (weighted headline), "
                              "iter/s, CPU-h saved"), caption
    # Every column went while the best column's long header was in the way; once it took its short one,
    # the final value fits again and comes back.
    assert "┃ final ┃" in out


def test_nodes_list_into_a_pipe_on_a_fresh_database(tmp_path: Path) -> None:
    """`ablate nodes add` and `ablate nodes list | cat` through a controller on a fresh database: the long
    address is printed whole (COLUMNS=80 as a small terminal sets)."""
    exe = shutil.which("ablate") or str(Path(sys.executable).parent / "ablate")
    key = tmp_path / "id_ed25519"
    key.write_text("not read by add\n")
    env = {
        **os.environ,
        "ABLATE_DATABASE_URL": f"sqlite:///{tmp_path / 'fresh' / 'ablate.db'}",
        "COLUMNS": "80",
    }
    host = "ceon1-very-long-hostname.internal.example"
    add = [exe, "nodes", "add", "ceon1", "--host", host, "--user", "ceon1", "--key", str(key), "--gpus", "4"]
    with controller_for(("nodes",), env, tmp_path / "home") as controller:  # a controller on that database
        added = subprocess.run(add, env={**env, **controller}, capture_output=True, text=True, timeout=120)
        assert added.returncode == 0, added.stderr
        listed = subprocess.run([exe, "nodes", "list"], env={**env, **controller}, capture_output=True, text=True,
                                timeout=120)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert f"ceon1@{host}:22" in listed.stdout and "registered" in listed.stdout and "…" not in listed.stdout


def test_a_number_cell_formats_floats_only() -> None:
    assert [number(None), number(0.123456), number(0.123456, ".3f"), number(3e-4, ".1e")] == [
        "-",
        "0.1235",
        "0.123",
        "3.0e-04",
    ]
    # A step stays a whole number, a name and a non-finite metric stored as text stay as they are.
    assert [number(12345), number("A"), number("nan", ".4f")] == ["12345", "A", "nan"]


def test_free_port_is_the_preferred_one_or_with_or_any_another() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        assert free_port("127.0.0.1", busy) is None  # `ablate serve` refuses it
        other = free_port("127.0.0.1", busy, or_any=True)  # `ablate demo` takes another
        assert other is not None and other != busy
