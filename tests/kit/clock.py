"""A sweep runner's clock, moved by the test."""

from __future__ import annotations

import time
from datetime import datetime, timedelta


class FakeClock:
    """The time the test sets (`clock.now = ...`), or, after `follow_real_time()`, that time plus the real
    seconds since (a bill that runs for as long as stopping and teardown really take)."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self._real_from: float | None = None

    def follow_real_time(self) -> None:
        self._real_from = time.monotonic()

    def __call__(self) -> datetime:
        if self._real_from is None:
            return self.now
        return self.now + timedelta(seconds=time.monotonic() - self._real_from)
