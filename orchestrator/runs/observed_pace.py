"""The pace the controller itself saw a run make, and the most hours left that pace allows: the bound on a
node's claimed rate (runs/replan.py `remaining_hours`).

As results/deciding/budget.py counts a run's GPU-hours from the controller's own placement and end
timestamps (a node's `gpu_hours` at most that), this counts a run's progress from the controller's own
clock: the attempt's placement (its `placed` event) and the time each record arrived (Metric.created_at,
set at ingest, never by the node). A record's `iter_per_sec` may say the run crawls; the steps the
controller saw arrive say how fast it went, so the run's hours left are at most the steps left at that
pace. The pace includes the attempt's start (compile, data) and is below an honest rate, so an honest
claim stands; a claim slower than what the controller saw never lengthens the run's projection, and so
never holds its grid's night and keeps the other arms from growing or starting.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Event, Metric, Run, aware


def attempt_placed_at(session: Session, run: Run) -> datetime | None:
    """When the controller placed the run's current attempt: that attempt's `placed` event, else the run's
    first placement (`started_at`); None for a run never placed."""
    rows = session.execute(
        select(Event.time, Event.data).where(Event.run_id == run.id, Event.kind == "placed")
        .order_by(Event.id.desc())
    ).all()  # fmt: skip
    for placed, data in rows:
        if (data or {}).get("attempt") == run.retries:
            return aware(placed)
    return aware(run.started_at) if run.started_at is not None else None


def observed_hours_left(session: Session, run: Run, steps: int, now: datetime) -> float | None:
    """At most how many hours the run has left, at the pace the controller saw: the steps its records
    reached in this attempt (past the highest step recorded before its placement) over the time from the
    placement to that record's arrival; the steps left to `steps` at that pace, less the time since the
    record arrived (never below 0). None where the controller saw no progress in this attempt: no record
    arrived after the placement with a step past the earlier ones, or none arrived later than it."""
    placed = attempt_placed_at(session, run)
    if placed is None:
        return None
    before = session.scalar(
        select(Metric.step).where(Metric.run_id == run.id, Metric.created_at <= placed)
        .order_by(Metric.step.desc()).limit(1)
    )  # fmt: skip
    latest = session.execute(
        select(Metric.step, Metric.created_at).where(Metric.run_id == run.id, Metric.created_at > placed)
        .order_by(Metric.step.desc()).limit(1)
    ).first()  # fmt: skip
    if latest is None:
        return None
    step, arrived = latest
    done = step - (before or 0)
    held_s = (aware(arrived) - placed).total_seconds()
    if done <= 0 or held_s <= 0:
        return None
    left_s = max(steps - step, 0) * held_s / done
    since_s = max((aware(now) - aware(arrived)).total_seconds(), 0.0)
    return max(left_s - since_s, 0.0) / 3600
