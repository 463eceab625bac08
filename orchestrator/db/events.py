"""A run's events: the one way a run's history (started, resumed, stopped, stored, ...) is written."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from orchestrator.db.models import Event, Run


def record_event(session: Session, run: Run, kind: str, message: str, /, **data: Any) -> None:
    session.add(Event(run_id=run.id, grid_id=run.grid_id, kind=kind, message=message, data=data))
