"""Renting test-bed nodes in-process: each instance's login user, the controller's rental settings with the
bed's short waits, and a sweep runner that rents from the provider simulator through the Vast SDK
(tests/cluster's rented-sweep tests, tests/cluster/rented_controller.py and bench/rented_night.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from orchestrator.db.models import Schedule, utcnow
from orchestrator.fleet.deadman import DeadmanConfig
from orchestrator.fleet.providers.base import Instance
from orchestrator.fleet.providers.lifecycle import Timing
from orchestrator.fleet.providers.vast import VastProvider
from orchestrator.sweeps.rented import RentalConfig
from orchestrator.sweeps.runner import SweepRunner
from orchestrator.sweeps.schedules import ScheduleCreate, create_schedule
from tests.cluster.testbed import TestBed
from tests.kit.bed import node_config

BED_TIMING = Timing(reachable_s=60, poll_s=0.2, destroy_s=60, connect_s=2)
# Two of the simulator's 4-GPU Vast offers (each becomes a bed node with the GPUs the bed hooks give it).
BED_REQUEST = {"provider": "vast", "gpu": "RTX_4090", "gpus_per_node": 4, "nodes": 2, "max_price_per_gpu_hour": 0.45}
DEADMAN_MARK = "deadman-fired"  # what the bed's dead-man's switch leaves in the node user's home when it fires


def bed_login_user(tag: str) -> Callable[[Instance], str]:
    """The bed node's user for an instance: node i listens on <prefix>.(11 + i) and logs in as <tag>u<i>
    (tests/cluster/testbed.py names them so); the providers' APIs cannot say it."""

    def user(instance: Instance) -> str:
        return f"{tag}u{int((instance.ssh_host or '').rsplit('.', 1)[-1]) - 11}"

    return user


def bed_rental(tag: str, home: Path, controller_id: str = "bed", **deadman: Any) -> RentalConfig:  # noqa: ANN401
    """Rent bed nodes: the controller's key and known hosts under home, the bed's short waits, and a dead-man's
    switch that only leaves DEADMAN_MARK when it fires (deadman: more DeadmanConfig fields, grace_s say)."""
    return RentalConfig(
        controller_id=controller_id,
        ssh_key=home / "rent_ed25519",  # made on first use
        known_hosts_dir=home / "known_hosts",
        image="ablate/worker:test",
        timing=BED_TIMING,
        login_user=bed_login_user(tag),  # type: ignore[arg-type]
        deadman=DeadmanConfig(command=f'touch "$HOME/{DEADMAN_MARK}"', python=sys.executable, **deadman),
    )


def vast_runner(
    database_url: str, storage: Path, bed: TestBed, key: str, sim_url: str, rental: RentalConfig,
    **kwargs: Any,  # noqa: ANN401
) -> SweepRunner:
    """The sweep runner of `ablate serve`, renting through the Vast SDK from the simulator at sim_url and
    bootstrapping the rented bed nodes with the bed's Python."""
    return SweepRunner(
        database_url,
        storage,
        node_config=node_config(bed),
        providers={"vast": VastProvider(key, server_url=sim_url)},
        rental=rental,
        **kwargs,
    )


def due_rented_night(
    session: Session, name: str, arms: list[str], overrides: dict[str, Any], **request: Any  # noqa: ANN401
) -> Schedule:
    """A nightly schedule of a grid of `arms` that rents BED_REQUEST (request: fields to change), due now."""
    body = ScheduleCreate(name=name, cron="0 22 * * *", grid={"name": name, "arms": arms, "overrides": overrides},
                          request={**BED_REQUEST, **request})
    schedule = create_schedule(session, body)
    schedule.next_fire_at = utcnow() - timedelta(seconds=1)
    return schedule
