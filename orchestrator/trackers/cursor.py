"""How far a run (or, with no run, its grid) has been forwarded to one tracker: its `tracker_runs` row."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import TrackerRun
from orchestrator.vocabulary import TrackerName


def tracker_cursor(session: Session, tracker: TrackerName, grid_id: int, run_id: int | None) -> TrackerRun:
    """The row, made (and flushed) when there is none yet."""
    row = session.scalar(
        select(TrackerRun).where(
            TrackerRun.tracker == tracker,
            TrackerRun.grid_id == grid_id,
            TrackerRun.run_id.is_(None) if run_id is None else TrackerRun.run_id == run_id,
        )
    )
    if row is None:
        row = TrackerRun(tracker=str(tracker), grid_id=grid_id, run_id=run_id, failures=0, closed=False)
        session.add(row)
        session.flush()
    return row
