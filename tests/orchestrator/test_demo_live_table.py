"""`ablate demo`'s live table on an 80-column terminal, redrawn as a real demo's arms move from queued to
stopped: no line past the edge, no word cut, and the same header on every refresh (issue 64 item 2)."""

from __future__ import annotations

import io
import re
import time
from collections.abc import Iterator
from typing import Any

from rich.cells import cell_len
from rich.console import Console

from orchestrator.cli.demo import _follow

WIDTH = 80
ARMS = ["A", "B", "C", "D", "A-lr500x"]
JUDGED = "held-out flow loss (weighted headline)"  # what the demo judges on the LPIPS stand-in
CHECKPOINT = "/home/researcher/ablate/.ablate/checkpoints/grid-7/run-35/best.pt"
REASON = "val_flow_ivw=nan, train_loss=nan, grad_norm=nan at step 150: diverged past 3 x its best"


def _row(i: int, arm: str, state: str, step: int | None, value: float | None = None, **stop: Any) -> dict[str, Any]:
    stopped = bool(stop)
    return {"arm": arm, "gpu": None if state == "queued" else str(i), "state": state, "steps": 400, "step": step,
            "decision": stop.get("decision"), "decision_step": step if stopped else None, "detector_stop": stopped,
            "final": value, "best": None if value is None else stop.get("best", value),
            "best_step": stop.get("best_step", step), "best_checkpoint": CHECKPOINT if stopped else None,
            "iter_s": None if value is None else 11.3, "hours_saved": stop.get("saved"),
            "reason": REASON if stopped else None, "judge_words": JUDGED}  # fmt: skip


def _frames() -> list[list[dict[str, Any]]]:
    """The refreshes of one demo: queued, starting, the first checkpoints, the broken arm stopped, the end."""
    broken = {"decision": "diverged", "best": 0.913, "best_step": 100, "saved": 0.0056}
    return [
        [_row(i, a, "queued", None) for i, a in enumerate(ARMS)],
        [_row(i, a, "starting", 0) for i, a in enumerate(ARMS)],
        [_row(i, a, "running", 50, 1.234) if i < 2 else _row(i, a, "running", 0) for i, a in enumerate(ARMS)],
        [_row(i, a, "running", 100, 0.8342) for i, a in enumerate(ARMS)],
        [_row(i, a, "running", 150, 0.6341) if a != "A-lr500x" else _row(i, a, "stopped", 150, float("nan"), **broken)
         for i, a in enumerate(ARMS)],
        [_row(i, a, "completed", 400, 0.2345) if a != "A-lr500x" else _row(i, a, "stopped", 150, float("nan"), **broken)
         for i, a in enumerate(ARMS)],
    ]  # fmt: skip


def _refreshes(console: Console) -> list[str]:
    """Each frame the demo drew, as text: read off the recording between one poll and the next."""
    drawn: list[str] = []
    frames: Iterator[list[dict[str, Any]]] = iter(_frames())

    def read_rows() -> list[dict[str, Any]]:
        drawn.append(console.export_text(clear=True))
        return next(frames)

    _follow(console, read_rows, t0=time.monotonic(), url="http://127.0.0.1:8765/", device="CPU", poll_s=0)
    drawn.append(console.export_text(clear=True))
    # A redraw moves the cursor up (a control code, not recorded) and writes on: split where each frame starts.
    return [frame for text in drawn for frame in re.split(r"(?=ablate demo: )", text) if frame.strip()]


def _words(text: str) -> set[str]:
    return set(re.split(r"[\s│┃]+", text))


def test_the_live_table_fits_80_columns_keeps_its_header_and_cuts_no_word() -> None:
    # The demo's console: a terminal that soft-wraps (so a line printed into a file stays one line).
    console = Console(file=io.StringIO(), width=WIDTH, record=True, soft_wrap=True, force_terminal=True,
                      color_system=None)  # fmt: skip
    refreshes = _refreshes(console)
    assert len(refreshes) == len(_frames()) + 1  # Live draws the last frame once more as it ends
    headers = set()
    for text, rows in zip(refreshes, [*_frames(), _frames()[-1]], strict=True):
        lines = text.splitlines()
        assert max(cell_len(line) for line in lines) <= WIDTH, text
        headers.add(next(line for line in lines if line.startswith("┃")))
        words = _words(text)
        for r in rows:  # the columns that always stay: arm, state, best
            state = r["state"] + (f" ({r['decision']} @{r['decision_step']})" if r["detector_stop"] else "")
            for cell in (r["arm"], state):
                assert set(cell.split()) <= words, f"{cell!r} cut:\n{text}"
        if any(r["detector_stop"] for r in rows):  # the stop's line, wrapped by words
            assert set(f"{CHECKPOINT} reason: {REASON}".split()) <= words, text
    assert len(headers) == 1, "\n".join(headers)
    # Fitted once for the widest cells: the step and the GPU fit beside the short "judged" header.
    assert [h.strip() for h in headers.pop().strip("┃").split("┃")] == ["arm", "state", "GPU", "step", "judged",
                                                                       "best"]


def test_the_judged_metric_is_named_from_the_spec_before_any_checkpoint(database_url: str) -> None:
    # On the LPIPS stand-in the detector judges the flow headline; a queued arm has no metric yet to say so,
    # and the header named "recon LPIPS" until the first checkpoint came.
    from model.spec import STANDIN
    from orchestrator.cli.demo import _rows, demo_grid
    from orchestrator.db.session import session_scope
    from orchestrator.grids.service import GridCreate, create_grid
    from orchestrator.settings import Settings

    with session_scope(database_url) as session:
        grid_id = create_grid(session, GridCreate(**demo_grid(STANDIN))).id
    rows = _rows(Settings(database_url=database_url), grid_id)
    assert [r["state"] for r in rows] == ["queued"] * 5
    assert {r["judge_words"] for r in rows} == {JUDGED}


def test_the_demos_last_lines_wrap_between_words_on_a_terminal_and_stay_whole_into_a_file() -> None:
    from orchestrator.cli.demo import closing_lines, demo_console

    lines = closing_lines("http://127.0.0.1:8765/", 7, hold=False)
    words = set(" ".join(lines).split())
    terminal = demo_console(file=io.StringIO(), width=WIDTH, force_terminal=True, color_system=None)
    for line in lines:
        terminal.print(line)
    shown = terminal.file.getvalue()  # type: ignore[attr-defined]
    assert max(cell_len(line) for line in shown.splitlines()) <= WIDTH and set(shown.split()) == words, shown
    into_a_file = demo_console(file=io.StringIO(), width=WIDTH)
    for line in lines:
        into_a_file.print(line)
    assert into_a_file.file.getvalue().splitlines() == lines  # type: ignore[attr-defined]
