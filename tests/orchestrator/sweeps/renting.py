"""What the rented-sweep tests share (test_rented_sweeps, test_preemption, test_ambiguous_create,
test_two_controllers): the provider key and offers, a sweep runner renting from the simulator over the
loopback sshd, and readers of schedules, sweeps and instances. Their fixtures are in conftest.py."""

from __future__ import annotations

import itertools
import os
import pwd
import sys
from datetime import timedelta
from pathlib import Path

from sqlalchemy import select

from orchestrator.db.models import Grid, RentedInstance, Sweep, utcnow
from orchestrator.db.session import session_scope
from orchestrator.fleet.bootstrap import BootstrapConfig
from orchestrator.fleet.deadman import DeadmanConfig
from orchestrator.fleet.providers.lifecycle import Timing
from orchestrator.fleet.providers.vast import VastProvider
from orchestrator.sweeps.rented import RentalConfig
from orchestrator.sweeps.runner import SweepRunner
from orchestrator.sweeps.schedules import ScheduleCreate, create_schedule, get_schedule
from orchestrator.vocabulary import RunState
from tests.cluster.provider_sim import ProviderSim
from tests.cluster.provider_wire import vast_offer

KEY = "sk-live-rented-sweeps-SECRET-0123456789"
GRID = {"name": "rented", "arms": ["A", "B"], "overrides": {"model": {"size": "tiny"}}}
FAST = Timing(reachable_s=2.0, poll_s=0.1, destroy_s=5.0, connect_s=0.5)
OFFERS = [vast_offer(301, dph_total=1.6), vast_offer(302, dph_total=1.2), vast_offer(303, dph_total=1.4)]
OFFERS.append(vast_offer(304, dph_total=1.5))
instance_ids = itertools.count(7001, 100)  # unique across the simulators of a session, as on Vast


def rented_runner(database_url: str, sshd, sim: ProviderSim, tmp_path: Path, remote: Path) -> SweepRunner:  # noqa: ANN001
    rental = RentalConfig(
        controller_id="night",
        ssh_key=sshd.client_key,
        known_hosts_dir=tmp_path / "known_hosts",
        image="ablate/worker:test",
        timing=FAST,
        login_user=lambda instance: sshd.user,  # the loopback sshd admits only this user, not root
        # The loopback sshd is this machine, perhaps as root: a dead-man's switch armed there would outlive
        # the test (and its stop command is `poweroff`). tests/cluster/test_deadman.py tests the switch.
        deadman=DeadmanConfig(enabled=False),
    )
    config = BootstrapConfig(
        python=sys.executable,
        remote_dir=remote.relative_to(pwd.getpwuid(os.getuid()).pw_dir).as_posix(),
        install=["{python} -c 'import sys; print(sys.version)'"],
        start=["echo {num_gpus} > {remote_dir}/joined"],
        leave=["rm -f {remote_dir}/joined"],
        command_timeout_s=60,
    )
    providers = {"vast": VastProvider(KEY, server_url=sim.url)}
    return SweepRunner(
        database_url, tmp_path / "storage", node_config=config, providers=providers, rental=rental, teardown_attempts=1
    )


def due_schedule(database_url: str, name: str, **request: object) -> int:
    body = ScheduleCreate(
        name=name,
        cron="0 22 * * *",
        grid=GRID,
        request={"provider": "vast", "gpu": "RTX_4090", "nodes": 1, "max_price_per_gpu_hour": 0.45, **request},
    )
    with session_scope(database_url) as session:
        schedule = create_schedule(session, body)
        schedule.next_fire_at = utcnow() - timedelta(seconds=1)  # due now, on the real clock
        return schedule.id


def sweep_of(database_url: str, schedule: str) -> Sweep:
    with session_scope(database_url) as session:
        sid = get_schedule(session, schedule).id
        return session.scalars(select(Sweep).where(Sweep.schedule_id == sid)).one()


def instances_of(database_url: str, sweep_id: int) -> list[RentedInstance]:
    with session_scope(database_url) as session:
        return list(session.scalars(select(RentedInstance).where(RentedInstance.sweep_id == sweep_id)))


def finish_runs(database_url: str, grid_id: int) -> None:
    with session_scope(database_url) as session:
        for run in session.get_one(Grid, grid_id).runs:
            run.state = RunState.completed
