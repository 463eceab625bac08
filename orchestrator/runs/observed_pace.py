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

The other way, a claim may say the run all but ended (9e4x the rate of a FLOP estimate is inside its span,
and made a 0.4 h run's hours left 4e-6 h, so its GPUs looked free now and a queued run was due on them).
The pace between the node's own records (`paced_hours_left`: from its first record of the attempt to
its latest, both arrivals on the controller's clock) has no start in it and is about an honest rate, so
a claim more than PACE_SPAN times faster is replaced by it (runs/replan.py).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
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


def paced_hours_left(session: Session, run: Run, steps: int, now: datetime) -> float | None:
    """At least about how many hours the run has left, at the pace the controller saw between the node's own
    records of this attempt: the steps from the first arrival after the placement (its highest step) to the
    highest step recorded, over the time between their arrivals (so without the attempt's start); the steps
    left to `steps` at that pace, less the time since that record arrived (never below 0). None where there
    is no such pace: the attempt's records arrived at one time (one reply), or no step past the first's."""
    placed = attempt_placed_at(session, run)
    if placed is None:
        return None
    first = session.scalar(
        select(func.min(Metric.created_at)).where(Metric.run_id == run.id, Metric.created_at > placed)
    )
    if first is None:
        return None
    start = session.scalar(select(func.max(Metric.step)).where(Metric.run_id == run.id, Metric.created_at == first))
    latest = session.execute(
        select(Metric.step, Metric.created_at).where(Metric.run_id == run.id, Metric.created_at > placed)
        .order_by(Metric.step.desc()).limit(1)
    ).first()  # fmt: skip
    if start is None or latest is None:
        return None
    step, arrived = latest
    between_s = (aware(arrived) - aware(first)).total_seconds()
    if step <= start or between_s <= 0:
        return None
    left_s = max(steps - step, 0) * between_s / (step - start)
    since_s = max((aware(now) - aware(arrived)).total_seconds(), 0.0)
    return max(left_s - since_s, 0.0) / 3600
