"""How a run's attempt ends on the controller: finished (completed, stopped, failed) with its event, or,
its worker gone, queued again to resume from its checkpoint until its retries run out."""

from __future__ import annotations

import logging

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestrator.db.events import record_event
from orchestrator.db.models import Event, Run, utcnow
from orchestrator.vocabulary import GROWN, RunState

log = logging.getLogger("ablate.launcher")


def finish_run(session: Session, run: Run, state: RunState, message: str, **data: object) -> None:
    run.state = state
    run.finished_at = utcnow()
    record_event(session, run, state.value, message, step=run.last_checkpoint_step, decision=run.decision, **data)
    log.info("run %s %s: %s", run.id, state, message)


def requeue_run(session: Session, run: Run, why: str, max_retries: int) -> None:
    """The run's worker is gone: stopped if it was being stopped, else queued again to resume from its
    checkpoint (retries + 1), or failed once retries pass max_retries (attempts begun by a growth are
    not retries)."""
    if run.being_stopped:
        finish_run(session, run, RunState.stopped, f"{run.stop_reason()}; {why}")
        return
    run.retries += 1
    if (lost := run.retries - growths(session, run)) > max_retries:
        run.error = f"worker lost {lost} times; last: {why}"
        finish_run(session, run, RunState.failed, run.error)
        return
    run.state = RunState.queued
    record_event(session, run, "worker_lost", f"{why}; re-queued, retry {lost}/{max_retries}",
                 attempt=run.retries)


def growths(session: Session, run: Run) -> int:
    """How many of the run's attempts began with a growth (runs/grow.py)."""
    return session.scalar(select(func.count()).where(Event.run_id == run.id, Event.kind == GROWN)) or 0
