"""A launcher listener (runs/launcher.py `LoopListener`) whose work is all in the loop's housekeeping pass:
the report writer and the decision pass of deciding grids. Nothing to start or stop, and a stored reply
tells it nothing (what it waits for, a grid's or a wave's last run ending, the pass finds)."""

from __future__ import annotations

from orchestrator.settings import Settings


class PassListener:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def notify(self, run_id: int) -> None:
        pass

    def housekeeping(self) -> None:
        raise NotImplementedError
