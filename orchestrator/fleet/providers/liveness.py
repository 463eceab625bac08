"""Whether a rented node that does not read `running` is lost: a pure guard chain over provider readings.

One reading is not enough. Vast computes `offline` from missed heartbeats, and a host that drops off the
network for a minute comes back with its container still running; destroying it then throws away the
arms' progress since their last checkpoint and pays a new rental and bootstrap. So a node is lost only
when the provider says so in a state it documents (taken back: `interrupted`; or gone), or after
`DownPolicy.readings` consecutive readings other than running over at least `DownPolicy.seconds`.
Interruptible and on-demand nodes get different policies: an interruptible one down for a minute was most
likely taken back without the provider saying so; an on-demand one is never taken back, so only a long
outage of its host loses it. The runner keeps the `Downtime` between ticks (orchestrator/sweeps/preemption.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from orchestrator.fleet.providers.base import Instance, InstanceState


class Verdict(StrEnum):
    up = "up"  # it reads running
    down = "down"  # it does not, not yet for long enough: kept
    preempted = "preempted"  # the provider says it took it back
    lost = "lost"  # gone, or down for the policy's readings and seconds


@dataclass(frozen=True)
class DownPolicy:
    """When consecutive readings other than running make a node lost: both counts must be reached."""

    readings: int
    seconds: float


# An interruptible node not running for a minute (3 ticks of 30 s): taken back, whatever the status says.
INTERRUPTIBLE = DownPolicy(readings=3, seconds=60.0)
# An on-demand node is never taken back: only a host gone for 10 minutes is given up.
ON_DEMAND = DownPolicy(readings=5, seconds=600.0)


@dataclass(frozen=True)
class Downtime:
    """Consecutive readings other than running: since when, and how many."""

    since: datetime
    readings: int


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    downtime: Downtime | None  # to pass to the next reading's judge (None once it reads running again)
    reason: str


def judge(instance: Instance, interruptible: bool, downtime: Downtime | None, now: datetime) -> Judgement:
    """The verdict on one reading of a node that was running, given the downtime judged so far."""
    if instance.state is InstanceState.gone:
        return Judgement(Verdict.lost, None, f"the provider no longer knows it ({instance.status})")
    if instance.state is InstanceState.interrupted:
        return Judgement(Verdict.preempted, None, f"the provider took it back (status {instance.status})")
    if instance.state is InstanceState.running:
        return Judgement(Verdict.up, None, f"status {instance.status}")
    policy = INTERRUPTIBLE if interruptible else ON_DEMAND
    kind = "interruptible" if interruptible else "on-demand"
    down = Downtime(downtime.since if downtime else now, (downtime.readings if downtime else 0) + 1)
    held = (now - down.since).total_seconds()
    counted = f"status {instance.status} for {down.readings} readings over {held:.0f} s"
    if down.readings >= policy.readings and held >= policy.seconds:
        limit = f"{policy.readings} readings over {policy.seconds:g} s"
        return Judgement(Verdict.lost, down, f"{counted}: the limit for an {kind} node ({limit})")
    limit = f"until {policy.readings} readings over {policy.seconds:g} s"
    return Judgement(Verdict.down, down, f"{counted}; an {kind} node is kept {limit}")
