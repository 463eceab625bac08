"""Events: the one way a run's or a sweep's history (started, resumed, stopped, stored, rented, ...) is written."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from orchestrator.db.models import Event, Run, Sweep


def record_event(session: Session, run: Run, kind: str, message: str, /, **data: Any) -> None:
    session.add(Event(run_id=run.id, grid_id=run.grid_id, kind=kind, message=message, data=data))


def record_sweep_event(session: Session, sweep: Sweep | None, kind: str, message: str, /, **data: Any) -> None:
    """A sweep's event, shown with its grid; `sweep` None for the runner's own (a fire skipped, a tick
    that failed, an instance reaped whose sweep this database does not know), which carry no sweep id."""
    if sweep is not None:
        data = {"sweep_id": sweep.id, **data}
    session.add(Event(grid_id=sweep.grid_id if sweep else None, kind=kind, message=message, data=data))
