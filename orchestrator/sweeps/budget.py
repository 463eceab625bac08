"""Budget arithmetic: what a sweep has spent so far, in the units of its nodes' price per hour."""

from __future__ import annotations

from datetime import datetime, timedelta

from orchestrator.db.models import Sweep
from orchestrator.sweeps.schedules import aware


def spend(sweep: Sweep, now: datetime) -> float:
    """A sweep that rented: what its instances billed (failed rentals included: the provider bills them
    too). On registered nodes: price per hour of all its nodes x hours since the fire (they bill all day;
    the sweep is charged from provisioning on)."""
    if sweep.instances:
        return round(sum(i.cost(aware(now)) for i in sweep.instances), 6)
    hours = max(0.0, (aware(now) - aware(sweep.fired_at)).total_seconds() / 3600)
    return round(sweep.price_per_hour * hours, 6)


def budget_end(sweep: Sweep, price_per_hour: float) -> datetime | None:
    """When a sweep paying `price_per_hour` from its fire on has spent its budget; None without one."""
    if sweep.budget is None or price_per_hour <= 0:
        return None
    return aware(sweep.fired_at) + timedelta(hours=sweep.budget / price_per_hour)
