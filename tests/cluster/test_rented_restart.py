"""A controller that rents is killed with `kill -9` mid-sweep, twice, and restarted on the same database.

The controller is the launcher and the sweep runner in one process (tests/cluster/rented_controller.py,
what `ablate serve` runs, without HTTP), renting through the real vastai SDK from the provider simulator,
whose instances are real namespace nodes of the test bed. What the code does after a restart:

- killed while renting (one instance created, the sweep still `provisioning`): the restarted runner's
  first tick resumes provisioning, which first destroys everything the interrupted attempt rented (by the
  sweep's rows and by its label) and then rents afresh. The leaked instance is gone before the new
  runner creates anything.
- killed while the arms train (sweep `running`): the restarted runner resumes the sweep that owns the
  instances (the reaper keeps what a live sweep owns), the restarted launcher adopts the detached
  workers, the sweep completes and releases its instances.
- an instance labelled for a sweep that is no longer live (a controller that died before it could
  record a create, a destroy that never confirmed): the reaper destroys it at the first tick.

Zero instances are left at the end, and the sweep's spend equals the simulator's bill for its instances.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from orchestrator.db.models import Event, Grid, Metric, Node, RentedInstance, Run, Sweep
from orchestrator.db.session import session_scope
from orchestrator.fleet.providers.base import InstanceLabel, LaunchSpec
from orchestrator.fleet.providers.vast import VastProvider
from orchestrator.vocabulary import RentedState, RunState, SweepState
from tests.cluster.provider_hooks import bed_hooks
from tests.cluster.provider_sim import ProviderSim, SimInstance
from tests.cluster.provider_wire import vast_offer
from tests.cluster.rental import due_rented_night
from tests.cluster.rented_controller import controller_env
from tests.cluster.testbed import TestBed
from tests.kit.bed import launcher_process
from tests.kit.polling import wait_for
from tests.kit.settings import bed_overrides

pytestmark = pytest.mark.bed(nodes=0)  # no nodes of its own: every node comes from a rental

pytest.importorskip("vastai", reason="the vastai SDK: pip install --no-deps vastai==1.9.1 runpod==1.12.0")

KEY = "sk-restart-rented-night-0123456789"
CONTROLLER = "bed"
TINY = bed_overrides(steps=40, checkpoint_every=5)
ARMS = ["A", "B", "C", {"parent": "A", "name": "A2"}]
# Two for the killed attempt (one gets rented), two for the resumed one, one for the planted orphan.
OFFERS = [vast_offer(600 + i, dph_total=1.2 + 0.04 * i) for i in range(6)]


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _sweep(database_url: str) -> Sweep:
    with session_scope(database_url) as session:
        return session.scalars(select(Sweep)).one()


def _streaming(database_url: str, grid_id: int) -> bool:
    with session_scope(database_url) as session:
        return bool(
            session.scalar(
                select(func.count())
                .select_from(Metric)
                .join(Run, Metric.run_id == Run.id)
                .where(Run.grid_id == grid_id, Run.state == RunState.running)
            )
        )


def _of_sweep(sim: ProviderSim, sweep_id: int) -> list[SimInstance]:
    return [i for i in sim.instances.values() if i.label == InstanceLabel(CONTROLLER, sweep_id).encode()]


def test_a_controller_killed_mid_sweep_leaks_nothing_after_restart(
    database_url: str, testbed: TestBed, tmp_path: Path
) -> None:
    bed, storage = testbed, testbed.storage  # type: ignore[attr-defined]
    with session_scope(database_url) as session:
        due_rented_night(session, "rented-restart", ARMS, TINY)
    log = tmp_path / "controller.log"
    timings: dict[str, float] = {}

    def controller() -> Any:  # noqa: ANN401 - a context manager
        return launcher_process(
            database_url, storage, log, "ablate-rent-restart", module="tests.cluster.rented_controller", **env
        )

    with ProviderSim(KEY, vast_offers=OFFERS, hooks=bed_hooks(bed, gpus=lambda inst: 2)) as sim:
        env = controller_env(bed, sim, KEY, CONTROLLER, tmp_path)
        # 1. Killed while renting: the first instance is recorded, the sweep is still provisioning.
        with controller() as proc:
            wait_for(lambda: _rows(database_url) >= 1, "the first rental recorded", 120, 0.05, log)
            _kill(proc)
        sweep = _sweep(database_url)
        assert sweep.state == SweepState.provisioning
        [leaked] = sim.live()

        # 2. Restarted: the first tick destroys the leaked instance before renting anything new.
        with controller() as proc:
            restarted = time.time()
            wait_for(lambda: not leaked.live, "the leaked instance destroyed", 60, 0.05, log)
            timings["provisioning leak destroyed after restart (s)"] = leaked.ended - restarted  # type: ignore[operator]
            wait_for(lambda: _sweep(database_url).state != SweepState.provisioning, "the sweep to run", 240, 0.2, log)
            sweep = _sweep(database_url)
            assert sweep.state == SweepState.running, sweep.error
            fresh = [i for i in _of_sweep(sim, sweep.id) if i is not leaked]
            assert len(fresh) == 2 and all(i.created > leaked.ended for i in fresh)  # type: ignore[operator]
            # 3. Killed again while the arms train.
            wait_for(lambda: _streaming(database_url, sweep.grid_id), "metrics while arms run", 240, 0.3, log)
            _kill(proc)
        assert _sweep(database_url).state == SweepState.running
        assert {i.id for i in sim.live()} == {i.id for i in fresh}  # nothing destroyed while it was dead

        # An instance of a sweep that is not live (99: none such), as a controller that died before it
        # could record its create leaves behind.
        provider = VastProvider(KEY, server_url=sim.url)
        [offer] = [o for o in provider.search(_request()) if o.offer_id == str(OFFERS[-1]["id"])]
        orphan = provider.create(
            offer, LaunchSpec("ablate/worker:test", 20, "ssh-ed25519 AAAA orphan", InstanceLabel(CONTROLLER, 99))
        )
        orphan_sim = sim.instances[orphan.instance_id]

        # 4. Restarted: the orphan reaped at once, the sweep resumed (its instances kept) to its end.
        with controller():
            restarted = time.time()
            wait_for(lambda: not orphan_sim.live, "the orphan reaped", 60, 0.05, log)
            timings["orphan reaped after restart (s)"] = orphan_sim.ended - restarted  # type: ignore[operator]
            assert all(i.live for i in fresh)  # a live sweep's instances are not the reaper's
            wait_for(lambda: _sweep(database_url).state not in _UNDER_WAY, "the sweep to end", 420, 0.5, log)
        print(json.dumps(timings))

        sweep = _sweep(database_url)
        assert sweep.state == SweepState.completed, sweep.error
        assert sim.live() == [] and bed.nodes == []
        with session_scope(database_url) as session:
            runs = list(session.get_one(Grid, sweep.grid_id).runs)
            rows = list(session.scalars(select(RentedInstance).where(RentedInstance.sweep_id == sweep.id)))
            reaped = session.scalars(select(Event).where(Event.kind == "rented.reaped")).all()
            assert session.scalars(select(Node)).all() == []
        assert {r.state for r in runs} == {RunState.completed}
        assert sorted(r.instance_id for r in rows) == sorted([leaked.id, *(i.id for i in fresh)])
        assert {r.state for r in rows} == {RentedState.destroyed}
        assert [e.data["instance_id"] for e in reaped] == [orphan.instance_id]
        # The sweep paid for all three of its instances, the killed attempt's included; the orphan is not its.
        bill = sum(i.cost() for i in _of_sweep(sim, sweep.id))
        print(f"spend {sweep.spend:.6f} vs simulator bill {bill:.6f}")
        price = sum(i.price_per_hour for i in _of_sweep(sim, sweep.id))
        assert bill <= sweep.spend <= bill + price * 2 / 3600


_UNDER_WAY = (SweepState.provisioning, SweepState.running, SweepState.stopping, SweepState.collecting)


def _rows(database_url: str) -> int:
    with session_scope(database_url) as session:
        return session.scalar(select(func.count()).select_from(RentedInstance)) or 0


def _request() -> Any:  # noqa: ANN401 - a NodeRequest
    from orchestrator.fleet.providers.request import NodeRequest

    return NodeRequest(provider="vast", gpu="RTX_4090", gpus_per_node=4, nodes=1, max_price_per_gpu_hour=0.45)
