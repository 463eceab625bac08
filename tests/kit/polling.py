"""Waiting on something real (a worker, a launcher, a node) in tests, without timing assertions."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def wait_for(
    check: Callable[[], Any],
    what: str,
    timeout: float = 90.0,
    interval: float = 0.1,
    log: Path | None = None,
    proc: subprocess.Popen | None = None,
) -> Any:
    """Poll `check` until it returns something truthy (returned); fail naming `what` after `timeout` s, or
    at once when `proc` (the process that should bring it about) has exited, with the tail of `log` when given."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the process exited {proc.returncode} while waiting for {what}{_tail(log)}")
        result = check()
        if result:
            return result
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}{_tail(log)}")


def _tail(log: Path | None) -> str:
    return f"; log:\n{log.read_text()[-4000:]}" if log is not None and log.exists() else ""


def final_reply(worker: Any) -> dict[str, Any]:  # noqa: ANN401 - a worker.actor.ArmWorker, driven in-process
    """Poll an in-process worker until it is no longer running; its last reply."""
    return wait_for(lambda: (r := worker.poll(None, 0.5))["state"] != "running" and r, "the worker to finish")


def done_reply(worker: Any) -> dict[str, Any]:  # noqa: ANN401 - a worker.actor.ArmWorker, driven in-process
    """`final_reply`, which must say the worker is done (its error otherwise)."""
    reply = final_reply(worker)
    assert reply["state"] == "done", reply["error"]
    return reply
