"""Events: the one way a run's or a sweep's history (started, resumed, stopped, stored, rented, ...) is written."""

from __future__ import annotations

from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from orchestrator.db.models import Event, Node, Run, Sweep

MAX_LISTED = 1000  # events one listing returns at most (newest first)


def record_event(session: Session, run: Run, kind: str, message: str, /, **data: Any) -> None:
    session.add(Event(run_id=run.id, grid_id=run.grid_id, kind=kind, message=message, data=data))


def record_sweep_event(session: Session, sweep: Sweep | None, kind: str, message: str, /, **data: Any) -> None:
    """A sweep's event, shown with its grid; `sweep` None for the runner's own (a fire skipped, a tick
    that failed, an instance reaped whose sweep this database does not know), which carry no sweep id."""
    if sweep is not None:
        data = {"sweep_id": sweep.id, **data}
    session.add(Event(grid_id=sweep.grid_id if sweep else None, kind=kind, message=message, data=data))


def list_events(
    session: Session,
    *,
    node: Node | None = None,
    run_id: int | None = None,
    grid_id: int | None = None,
    kind: str | None = None,
    before_id: int | None = None,
    limit: int = 100,
) -> list[Event]:
    """Events newest first, narrowed by each filter given: a node's own (its commands, probes, bootstraps,
    refusals) and its runs' starts on it; a run's; a grid's; a kind, or a kind prefix ending in "."
    ("node." for every node event); older than `before_id` (the next page)."""
    query = select(Event).order_by(Event.id.desc()).limit(max(1, min(limit, MAX_LISTED)))
    if node is not None:
        query = query.where(or_(Event.node_id == node.id, Event.data["node_name"].as_string() == node.name))
    if run_id is not None:
        query = query.where(Event.run_id == run_id)
    if grid_id is not None:
        query = query.where(Event.grid_id == grid_id)
    if kind:
        query = query.where(Event.kind.startswith(kind, autoescape=True) if kind.endswith(".") else Event.kind == kind)
    if before_id is not None:
        query = query.where(Event.id < before_id)
    return list(session.scalars(query))
