"""Tables that read at any width: whole columns give way, never the text in a cell.

On a terminal narrower than the table, columns are first given their short header, then dropped, lowest
priority first, and the caption names what was hidden; a cell is never cut or wrapped. Written to a file or
a pipe (not a terminal), the table is printed whole at the width it needs. A table redrawn in place (the
demo's live table) is fitted to the widest content its columns can take, so its header and its columns stay
the same from one refresh to the next.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

# Rich's default box: one border column per column edge, one space of padding each side of a cell.
PADDING = 2


@dataclass(frozen=True)
class Column:
    header: str
    # 0: always shown; a higher number is hidden sooner when the terminal is too narrow.
    priority: int = 0
    # A shorter header tried before the column is hidden (e.g. "recon" for "recon LPIPS ± SE").
    short: str | None = None
    justify: str = "left"


# A cell is plain text, or rich Text where it carries style (a red node whose teardown failed).
Cell = str | Text

# What a terminal would act on rather than show: escape sequences whole (OSC 0 retitles the window, OSC 52
# writes the clipboard, CSI moves the cursor or clears the screen), then any other C0/C1 control character
# but newline and tab, and the bidirectional overrides that make text read other than it is.
_ESCAPES = re.compile(
    r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC ... BEL or ST
    r"|\x1b\[[0-?]*[ -/]*[@-~]|\x9b[0-?]*[ -/]*[@-~]"  # CSI (7- and 8-bit)
    r"|\x9d[^\x07\x9c]*[\x07\x9c]?"  # 8-bit OSC
    r"|\x1b[@-_]?"  # any other escape
)
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: str) -> str:
    """`text` (a node's error, a name a node reported) with nothing a terminal would act on. Every table
    and error line the CLI prints passes here."""
    return _CONTROLS.sub("", _ESCAPES.sub("", text))


def _safe(cell: Cell) -> Text:
    if not isinstance(cell, Text):
        return Text(terminal_safe(str(cell)))
    clean = terminal_safe(cell.plain)
    return cell if clean == cell.plain else Text(clean, style=cell.style)


def _width(cell: Cell) -> int:
    text = cell.plain if isinstance(cell, Text) else cell
    return max((cell_len(line) for line in text.splitlines()), default=0)


def table_width(headers: Sequence[str], rows: Sequence[Sequence[Cell]], keep: Sequence[int]) -> int:
    """Characters the table takes with the columns `keep`, each as wide as its widest cell or header."""
    widths = [max([cell_len(headers[i]), *(_width(r[i]) for r in rows)]) for i in keep]
    return sum(w + PADDING for w in widths) + len(keep) + 1


def fit(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], width: int | None) -> tuple[list[str], list[int]]:
    """(headers, indices of the columns shown) for a terminal `width` wide; None: no limit."""
    headers = [c.header for c in columns]
    keep = list(range(len(columns)))
    if width is None:
        return headers, keep
    # Lowest priority first; among equals, the rightmost (the leftmost columns name the row).
    order = sorted((i for i, c in enumerate(columns) if c.priority > 0), key=lambda i: (-columns[i].priority, -i))
    for i in order:
        if table_width(headers, rows, keep) <= width:
            break
        if columns[i].short is not None:
            headers[i] = columns[i].short
            if table_width(headers, rows, keep) <= width:
                break
        keep.remove(i)
    for i in keep:  # the columns that always stay may still take their short header
        if columns[i].short is not None and table_width(headers, rows, keep) > width:
            headers[i] = columns[i].short
    dropped = [i for i in order if i not in keep]
    # A column dropped before a later short header made room comes back, most important first, while it fits.
    for i in reversed(dropped):
        wider = sorted([*keep, i])
        if table_width(headers, rows, wider) > width:
            break
        keep = wider
    return headers, keep


def build(
    title: str,
    columns: Sequence[Column],
    rows: Sequence[Sequence[Cell]],
    width: int | None,
    show_lines: bool = False,
    widest: Sequence[Cell] | None = None,
) -> tuple[Table, int]:
    """The table fitted to `width` (None: whole) and the width it needs. `widest`: a row of the widest content
    each column can take (a table redrawn as its rows change): the columns are chosen, and sized, for it, so
    a later refresh with longer cells keeps the same header."""
    rows = [[_safe(cell) for cell in row] for row in rows]
    title = terminal_safe(title)
    sizing = [*rows, [_safe(cell) for cell in widest]] if widest is not None else rows
    headers, keep = fit(columns, sizing, width)
    hidden = [columns[i].header for i in range(len(columns)) if i not in keep]
    caption = None
    if hidden:
        caption = f"hidden on this narrow terminal: {', '.join(hidden)} (widen it, or pipe to a file for all)"
    needed = max(table_width(headers, sizing, keep), cell_len(title), cell_len(caption or ""))
    # Too narrow even for the columns that always stay: their text folds onto more lines, never cut.
    fits = width is None or table_width(headers, sizing, keep) <= width
    table = Table(  # Text, not markup: titles hold user text ("[/]" in a grid name is not a closing tag)
        title=Text(title, style="italic"),
        title_justify="left",
        caption=Text(caption, style="dim italic") if caption else None,
        caption_justify="left",
        show_lines=show_lines,
    )
    for i in keep:
        # As wide as the widest content it can take: the table keeps its shape from one refresh to the next.
        least = max(cell_len(headers[i]), _width(widest[i])) if widest is not None and fits else None
        table.add_column(
            headers[i], justify=columns[i].justify, no_wrap=fits, overflow="fold", min_width=least
        )  # type: ignore[arg-type]
    for row in rows:
        table.add_row(*(row[i] for i in keep))
    return table, needed


def print_table(
    title: str,
    columns: Sequence[Column],
    rows: Sequence[Sequence[Cell]],
    console: Console | None = None,
    show_lines: bool = False,
) -> None:
    """Print the table fitted to the terminal, or whole when the output is not a terminal."""
    console = console or Console()
    if console.is_terminal:
        table, _ = build(title, columns, rows, console.width, show_lines)
        # Wrapped here even on a soft-wrapping console: else the terminal breaks a long caption mid-word.
        console.print(table, soft_wrap=False)
        return
    table, needed = build(title, columns, rows, None, show_lines)
    # A file or pipe has no width: print at the table's own, so no cell is folded or cut.
    Console(file=console.file, width=needed, no_color=console.no_color, highlight=False).print(table)
