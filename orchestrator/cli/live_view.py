"""A display redrawn in place (the demo's live table): its lines wrapped at the terminal's width, never cut.

Rich's Live redraws through the console's own print, so on a soft-wrapping console (the demo's was one)
nothing is wrapped and Live crops each line at the terminal's edge, mid-word. Wrapped here, the view reads
the same whatever console it is drawn on.
"""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.live import Live


class WrappedAtWidth:
    """`renderable` wrapped by words at the width it is drawn at, whatever the console's soft wrap says."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from console.render(self.renderable, options.update(no_wrap=False, overflow="fold"))


def live_view(console: Console) -> Live:
    """The Live the demo redraws its table in: twice a second, left on screen when it ends."""
    return Live(console=console, refresh_per_second=2, transient=False)
