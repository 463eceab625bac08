"""What to destroy: labelled instances of this controller that no live sweep owns.

A pure function over what the providers list (`Provider.list_owned`) and which sweeps are live (from
the database), so the runner calls it at start-up and every tick, and the tests replay it on records.
An instance is kept only while a live sweep owns it: a crashed controller that restarts destroys what
its dead sweeps rented, and a sweep it resumes keeps its nodes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.fleet.providers.base import Instance, InstanceState


@dataclass(frozen=True)
class Reap:
    """One instance to destroy and why (the why goes on the event the runner writes)."""

    instance: Instance
    reason: str


def to_reap(instances: Iterable[Instance], controller_id: str, live_sweeps: Iterable[int]) -> list[Reap]:
    """The instances to destroy, in listing order. Another controller's instance, an unlabelled one and
    one already gone are never touched; a stopped one still bills for its disk, so it is reaped too."""
    live = set(live_sweeps)
    doomed: list[Reap] = []
    for instance in instances:
        label = instance.label
        if label is None or label.controller_id != controller_id:
            continue  # not ours: someone else's machine on a shared account
        if instance.state is InstanceState.gone:
            continue
        if label.sweep_id in live:
            continue
        doomed.append(Reap(instance, f"sweep {label.sweep_id} is not live ({instance.provider} {instance.status})"))
    return doomed
