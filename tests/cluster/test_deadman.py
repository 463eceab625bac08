"""The dead-man's switch on a rented node of the namespace test bed, with a deadline a few seconds out.

A sweep with a budget worth ~12 s of its offer's price rents one node through the real SDK from the
provider simulator (`rent_nodes`, the runner's own path; no Ray: bootstrap is not what is tested). The
switch is armed before bootstrap; the controller then does nothing at all, as if it were dead.
- Vast and RunPod give each instance a key scoped to it (the simulator too: CONTAINER_API_KEY /
  RUNPOD_API_KEY in the instance's environment, refused for anything but that instance): at the
  deadline the node destroys itself through the provider's API with that key; the simulator records
  that the scoped key, not the account's, ended it.
- A provider that gives no such key: the stop command runs (here it touches a file, the stand-in for
  `poweroff`); the instance still exists (a stop is not a destroy) until the controller's release.
The account's API key is nowhere on the node: not in its files, not on a command line.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from sqlalchemy import select

from orchestrator.db.models import Event, Sweep, utcnow
from orchestrator.db.session import session_scope
from orchestrator.fleet.providers.base import Provider
from orchestrator.fleet.providers.request import NodeRequest
from orchestrator.sweeps.rented import rent_nodes
from orchestrator.sweeps.runner import SweepRunner
from orchestrator.sweeps.schedules import ScheduleCreate, create_schedule
from tests.cluster.provider_hooks import bed_hooks
from tests.cluster.provider_sim import ProviderSim
from tests.cluster.provider_wire import runpod_gpu, vast_offer
from tests.cluster.rental import DEADMAN_MARK, bed_rental
from tests.cluster.testbed import TestBed
from tests.kit.polling import wait_for

pytestmark = pytest.mark.bed(nodes=0)  # no nodes of its own: every node comes from a rental

pytest.importorskip("vastai", reason="the vastai SDK: pip install --no-deps vastai==1.9.1 runpod==1.12.0")
pytest.importorskip("runpod", reason="the runpod SDK: pip install --no-deps vastai==1.9.1 runpod==1.12.0")

KEY = "sk-deadman-account-key-0123456789"
RUNS_FOR_S = 12.0  # the budget, in seconds of the offer's price; the grace is 0
REQUESTS = {
    "vast": NodeRequest(provider="vast", gpu="RTX_4090", gpus_per_node=4, nodes=1, max_price_per_gpu_hour=0.45),
    "runpod": NodeRequest(
        provider="runpod", gpu="NVIDIA GeForce RTX 4090", gpus_per_node=4, nodes=1, max_price_per_gpu_hour=0.45
    ),
}
PRICE = {"vast": 1.2, "runpod": 4 * 0.34}  # what the simulator's offer below bills per hour for the node


def _provider(name: str, sim: ProviderSim) -> Provider:
    if name == "vast":
        from orchestrator.fleet.providers.vast import VastProvider

        return VastProvider(KEY, server_url=sim.url)
    from orchestrator.fleet.providers.runpod import RunPodProvider

    return RunPodProvider(KEY, api_url=sim.url)


def _rent_one(database_url: str, bed: TestBed, sim: ProviderSim, name: str, tmp: Path) -> tuple[int, str]:
    """Fire a schedule whose budget lasts RUNS_FOR_S, rent its one node; (sweep id, instance id)."""
    body = ScheduleCreate(
        name=f"deadman-{name}-{len(sim.instances)}-{time.monotonic_ns()}",
        cron="0 22 * * *",
        grid={"name": "deadman", "arms": ["A"]},
        request=REQUESTS[name].model_dump(),
        budget=PRICE[name] * RUNS_FOR_S / 3600,
    )
    with session_scope(database_url) as session:
        for other in session.scalars(select(Sweep)):
            other.state = "failed"  # an earlier test's sweep is over
        create_schedule(session, body).next_fire_at = utcnow() - timedelta(seconds=1)
    runner = SweepRunner(database_url, tmp)
    [sweep_id] = runner.fire_due(utcnow())
    config = bed_rental(bed.tag, tmp, grace_s=0)
    provider = _provider(name, sim)
    [node] = rent_nodes(database_url, sweep_id, REQUESTS[name], provider, config, lambda n: None, utcnow)
    return sweep_id, node.split("-", 1)[1]


def _no_account_key_on(bed: TestBed) -> None:
    for node in bed.nodes:
        for path in node.home.rglob("*"):
            if path.is_file():
                assert KEY not in path.read_text(errors="replace"), path
        for pid in bed.node_processes(node):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            assert KEY not in cmdline


@pytest.mark.parametrize("name", ["vast", "runpod"])
def test_at_the_deadline_the_node_destroys_itself_with_its_own_scoped_key(
    name: str, database_url: str, testbed: TestBed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNPOD_API_BASE_URL", "http://127.0.0.1:9")  # the provider sets it; restored after
    hooks = bed_hooks(testbed, gpus=lambda inst: 1)
    with ProviderSim(
        KEY,
        vast_offers=[vast_offer(801, dph_total=1.2)],
        runpod_gpus=[runpod_gpu()],
        hooks=hooks,
        host=testbed.controller_ip,
    ) as sim:
        testbed.allow_to_controller(urlsplit(sim.url).port)  # the provider's API stands for the internet
        sweep_id, iid = _rent_one(database_url, testbed, sim, name, tmp_path)
        inst = sim.instances[iid]
        with session_scope(database_url) as session:
            [armed] = session.scalars(select(Event).where(Event.kind == "rented.deadman")).all()[-1:]
            deadline = datetime.fromisoformat(armed.data["deadline"]).timestamp()
            messages = [e.message + str(e.data) for e in session.scalars(select(Event))]
        assert armed.data["instance_id"] == iid and "scoped to this instance" in armed.message
        assert inst.live and deadline > time.time()  # armed before the deadline, the node still runs
        _no_account_key_on(testbed)
        assert not any(KEY in m for m in messages)

        node_log = testbed.nodes[0].home / ".ablate-deadman.log"
        wait_for(lambda: not inst.live, "the node to destroy itself", RUNS_FOR_S + 60, 0.1, node_log)
        print(f"{name}: destroyed {inst.ended - deadline:.2f} s after the deadline")  # type: ignore[operator]
        assert inst.ended_by == "scoped"  # its own key, not the account's
        assert inst.ended >= deadline  # never early  # type: ignore[operator]
        wait_for(lambda: testbed.nodes == [], "the simulator's destroy to remove the node", 30, 0.1)
        assert sim.live() == []


def test_without_a_scoped_key_the_node_runs_the_stop_command(
    database_url: str, testbed: TestBed, tmp_path: Path
) -> None:
    hooks = bed_hooks(testbed, gpus=lambda inst: 1, scoped=False)
    offers = [vast_offer(802, dph_total=1.2)]
    # Instance ids apart from the first test's (7001), which are in the same database.
    with ProviderSim(KEY, vast_offers=offers, hooks=hooks, host=testbed.controller_ip, first_vast_id=7101) as sim:
        testbed.allow_to_controller(urlsplit(sim.url).port)
        sweep_id, iid = _rent_one(database_url, testbed, sim, "vast", tmp_path)
        inst = sim.instances[iid]
        [node] = testbed.nodes
        fired, log_path = node.home / DEADMAN_MARK, node.home / ".ablate-deadman.log"
        assert not fired.exists()

        def logged() -> str:
            return log_path.read_text() if log_path.exists() else ""

        # The mark appears while the command runs; its exit is logged just after: wait for both.
        wait_for(lambda: fired.exists() and "the stop command exited" in logged(), "the stop command to run",
                 RUNS_FOR_S + 60, 0.1)  # fmt: skip
        log = logged()
        assert "no CONTAINER_API_KEY on this instance" in log and "the stop command exited 0" in log
        assert inst.live  # a stop is not a destroy: the controller's release (or reaper) still destroys it
        _no_account_key_on(testbed)
