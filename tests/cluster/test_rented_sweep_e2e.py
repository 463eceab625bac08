"""The night rented end to end: a schedule that asks for two nodes (not names) fires; the runner rents
them through the real vastai SDK from the provider simulator, whose instances are real namespace nodes
of the test bed (own sshd, own address, stand-in nvidia-smi); their host keys are pinned at first
contact; they are bootstrapped and join the token-auth Ray head; the real launcher (its own process)
trains tiny arms on their logical GPUs; results are copied back; both instances are destroyed. Zero
instances are left, and the sweep's spend equals the simulator's per-second bill within three seconds' price

Only the providers' HTTP API is simulated: SSH, bootstrap, Ray, training and copy-back are real.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import select

from orchestrator.db.models import Event, Grid, Node, RentedInstance, Run, Schedule, Sweep
from orchestrator.db.session import session_scope
from orchestrator.vocabulary import RentedState, RunState, SweepState
from tests.cluster.provider_hooks import bed_hooks
from tests.cluster.provider_sim import ProviderSim
from tests.cluster.provider_wire import vast_offer
from tests.cluster.rental import bed_rental, due_rented_night, vast_runner
from tests.cluster.testbed import TestBed
from tests.kit.bed import launcher_process
from tests.kit.settings import bed_overrides

pytestmark = pytest.mark.bed(nodes=0)  # no nodes of its own: every node comes from a rental

pytest.importorskip("vastai", reason="the vastai SDK: pip install --no-deps vastai==1.9.1 runpod==1.12.0")

KEY = "sk-e2e-rented-night-0123456789"
TINY = bed_overrides(steps=20, checkpoint_every=5)
ARMS = ["A", "B", "C", {"parent": "A", "name": "A2"}]  # four arms: one per logical GPU of two 2-GPU nodes
# The cheapest two fit (0.30 and 0.35 per GPU-hour); the third is over the cap.
OFFERS = [vast_offer(501, dph_total=1.4), vast_offer(502, dph_total=1.2), vast_offer(503, dph_total=2.4)]


def test_a_request_schedule_rents_two_nodes_trains_copies_back_and_destroys_them(
    database_url: str, testbed: TestBed, tmp_path: Path
) -> None:
    bed, storage = testbed, testbed.storage  # type: ignore[attr-defined]
    with session_scope(database_url) as session:
        due_rented_night(session, "rented-night", ARMS, TINY)

    # The offers are 4-GPU machines; each becomes a bed node with 2 logical GPUs (two cores here).
    with ProviderSim(KEY, vast_offers=OFFERS, hooks=bed_hooks(bed, gpus=lambda inst: 2)) as sim:
        rental = bed_rental(bed.tag, tmp_path / "controller")
        runner = vast_runner(database_url, storage, bed, KEY, sim.url, rental)
        log = tmp_path / "launcher.log"
        with launcher_process(database_url, storage, log, "ablate-rented"):
            fired = time.monotonic()
            runner.tick()  # fire: rent two, pin, register, bootstrap, join; submit the grid
            with session_scope(database_url) as session:
                sweep = session.scalars(select(Sweep)).one()
            assert sweep.state == SweepState.running, sweep.error
            assert len(sim.live()) == 2 and len(bed.nodes) == 2
            deadline = time.monotonic() + 480
            while True:
                with session_scope(database_url) as session:
                    sweep = session.get_one(Sweep, sweep.id)
                if sweep.state in (SweepState.completed, SweepState.failed, SweepState.stopped):
                    break
                assert time.monotonic() < deadline, f"sweep still {sweep.state}; launcher: {log.read_text()[-3000:]}"
                runner.tick()
                time.sleep(1.0)
            print(f"fire -> sweep ended: {time.monotonic() - fired:.1f} s")

        assert sweep.state == SweepState.completed, sweep.error
        with session_scope(database_url) as session:
            runs = list(session.get_one(Grid, sweep.grid_id).runs)
            instances = list(session.scalars(select(RentedInstance).where(RentedInstance.sweep_id == sweep.id)))
            started = session.execute(
                select(Event.data).join(Run, Event.run_id == Run.id).where(
                    Run.grid_id == sweep.grid_id, Event.kind == "started"
                )
            ).scalars().all()
            pinned = session.scalars(select(Event).where(Event.kind == "rented.host_key_pinned")).all()
            nodes_left = session.scalars(select(Node)).all()
        assert {r.state for r in runs} == {RunState.completed}
        # Rented the two cheapest fitting offers; both destroyed, confirmed.
        assert sorted(i.offer_id for i in instances) == ["501", "502"]
        assert {i.state for i in instances} == {RentedState.destroyed}
        assert all(i.destroy_confirmed_at is not None and i.host_key for i in instances)
        # Trained on the rented nodes, and each node's host key was pinned to its instance.
        assert {d["node_name"] for d in started} == {f"vast-{i.instance_id}" for i in instances}
        assert sorted(e.data["fingerprint"] for e in pinned) == sorted(i.host_key for i in instances)
        for run in runs:
            assert (Path(sweep.results_dir) / "runs" / f"{run.id}-{run.arm}" / "best.pt").is_file()
        # Nothing left: no instance at the provider, no namespace node, no node row.
        assert sim.live() == [] and bed.nodes == [] and nodes_left == []
        bill = sim.bill()
        print(f"spend {sweep.spend:.6f} vs simulator bill {bill:.6f}")
        # The spend runs to the destroy's confirmation, which here includes removing the namespace node
        # (its processes ended, its user deleted): up to a few seconds on two shared cores.
        assert bill <= sweep.spend <= bill + (1.4 + 1.2) * 3 / 3600
        with session_scope(database_url) as session:
            assert session.scalars(select(Schedule)).one().request is not None
