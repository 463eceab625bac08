"""Stopping a whole grid on the user's request, saying what happened to each run.

Each run is stopped as `service.stop_run` stops one (queued: at once; starting/running: the launcher stops
its worker at its next step, keeping a checkpoint). Stopping again changes nothing and is no error: a run
already ended or already being stopped is reported as such.
"""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import BaseModel
from sqlalchemy.orm import Session

from orchestrator.db.models import Grid, Run
from orchestrator.grids.service import RunConflict, stop_run
from orchestrator.vocabulary import TERMINAL_STATES, RunState

StopOutcome = Literal["stopped", "stop_requested", "already_stopping", "already_ended"]

_SAID = {
    "stopped": "stopped before it started",
    "stop_requested": "stop requested: it stops at its next step, keeping a checkpoint",
    "already_stopping": "already being stopped: it stops at its next step, keeping a checkpoint",
}


class AnyRun(Protocol):
    """A run as a row or as the API's RunPublic: what a stop outcome names of it."""

    id: int
    arm: str
    seed: int
    state: str


class RunStopped(BaseModel):
    """What a stop request did to one run."""

    run_id: int
    arm: str
    seed: int
    state: RunState  # after the request
    outcome: StopOutcome
    message: str  # the outcome in words, e.g. "already completed: nothing to stop"

    @classmethod
    def of(cls, run: AnyRun, outcome: StopOutcome) -> RunStopped:
        said = _SAID.get(outcome) or f"already {run.state}: nothing to stop"
        return cls(run_id=run.id, arm=run.arm, seed=run.seed, state=RunState(run.state), outcome=outcome,
                   message=said)


class GridStopped(BaseModel):
    """POST /api/grids/{id}/stop: every run of the grid, in the grid's order, with what the request did."""

    grid_id: int
    runs: list[RunStopped]


def nothing_to_ask(state: str, stop_requested: bool) -> StopOutcome | None:
    """Why a run in `state` needs no stop request (it ended, or it is being stopped), or None: ask."""
    if state in TERMINAL_STATES:
        return "already_ended"
    if stop_requested and state != RunState.queued:
        return "already_stopping"
    return None


def stop_each(session: Session, run: Run) -> RunStopped:
    """Stop `run` unless it ended or is being stopped already; flushes, no commit."""
    standing = nothing_to_ask(run.state, run.stop_requested)
    if standing is not None:
        return RunStopped.of(run, standing)
    try:
        stop_run(session, run)
    except RunConflict:  # it ended between the read above and the stop (the launcher's compare-and-set won)
        return RunStopped.of(run, "already_ended")
    return RunStopped.of(run, "stopped" if run.state == RunState.stopped else "stop_requested")


def stop_grid(session: Session, grid: Grid) -> GridStopped:
    """Stop every run of `grid`; flushes, no commit."""
    return GridStopped(grid_id=grid.id, runs=[stop_each(session, run) for run in grid.runs])
