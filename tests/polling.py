"""Waiting on something real (a worker, a scheduler, a node) in tests, without timing assertions."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def wait_for(
    check: Callable[[], Any], what: str, timeout: float = 90.0, interval: float = 0.1, log: Path | None = None
) -> Any:
    """Poll `check` until it returns something truthy (returned); fail naming `what` after `timeout` s,
    with the tail of `log` when given."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(interval)
    tail = f"; log:\n{log.read_text()[-4000:]}" if log is not None and log.exists() else ""
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}{tail}")
