"""A rented interruptible node preempted mid-training, on the namespace test bed.

A schedule asks for two interruptible Vast nodes; the runner rents them from the provider simulator
(real vastai SDK), whose instances are real namespace nodes (own sshd, address, stand-in nvidia-smi);
they bootstrap and join the token-auth Ray head, and the real launcher (its own process) trains tiny
arms on them with checkpoints in S3 (moto on the controller's bridge address). Mid-training the
provider takes one node back: it reports `exited` and every process on the machine dies, its Ray
with it. The runner marks the instance `preempted`, destroys it (confirmed), drops its node and rents
a replacement (no budget: allowed); the arms that ran there re-queue through the launcher's
lost-worker path and complete: each from the newest checkpoint it had in S3 when the node was lost, or,
for an arm whose first checkpoint had not finished uploading then (its records may have), from step 0:
both are correct, and only the arm the test waited for is sure to have one. At the end: every run
completed, results copied back, zero instances left at the provider, no namespace node, no node row.
The branch without a replacement (budget too small): tests/orchestrator/sweeps/test_preemption.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from orchestrator.db.models import Event, Grid, Metric, Node, RentedInstance, Sweep, utcnow
from orchestrator.db.session import session_scope
from orchestrator.vocabulary import RentedState, RunState, SweepState
from tests.cluster.provider_hooks import bed_hooks
from tests.cluster.provider_sim import ProviderSim, SimInstance
from tests.cluster.provider_wire import vast_offer
from tests.cluster.rental import bed_rental, due_rented_night, vast_runner
from tests.cluster.testbed import TestBed
from tests.kit.bed import BUCKET, aws_profile, launcher_process
from tests.kit.readers import grid_runs, stored_step
from tests.kit.settings import bed_overrides

pytestmark = pytest.mark.bed(nodes=0)  # no nodes of its own: every node comes from a rental

pytest.importorskip("vastai", reason="the vastai SDK: pip install --no-deps vastai==1.9.1 runpod==1.12.0")

KEY = "sk-preempted-night-0123456789"
TINY = bed_overrides(steps=40, checkpoint_every=10)
# Two rented at fire (the cheapest), the third is the replacement.
OFFERS = [vast_offer(601, dph_total=1.4), vast_offer(602, dph_total=1.2), vast_offer(603, dph_total=1.6)]


def test_a_preempted_rented_node_s_arms_resume_elsewhere_and_a_replacement_is_rented(
    database_url: str,
    testbed: TestBed,
    s3_on_bridge: str,
    tmp_path: Path,
) -> None:
    bed, storage = testbed, testbed.storage  # type: ignore[attr-defined]
    with session_scope(database_url) as session:
        due_rented_night(session, "preempted-night", ["A", "B", "C"], TINY, interruptible=True)

    hooks = bed_hooks(bed, gpus=lambda inst: 2)
    made = hooks.on_create

    def on_create(inst: SimInstance) -> tuple[str, int]:
        endpoint = made(inst)
        aws_profile(inst.handle)  # the usual S3 credentials in the node user's home
        return endpoint

    hooks.on_create = on_create
    with ProviderSim(KEY, vast_offers=OFFERS, hooks=hooks, first_vast_id=8101) as sim:
        rental = bed_rental(bed.tag, tmp_path / "controller")
        runner = vast_runner(database_url, storage, bed, KEY, sim.url, rental,
                             checkpoint_options={"endpoint_url": s3_on_bridge})
        log = tmp_path / "launcher.log"
        options = {
            "ABLATE_CHECKPOINT_URL": f"s3://{BUCKET}/preempted",
            "ABLATE_CHECKPOINT_OPTIONS": json.dumps({"endpoint_url": s3_on_bridge}),
            "ABLATE_CHECKPOINT_KEEP_LAST": "1",
        }
        with launcher_process(database_url, storage, log, "ablate-preempt", **options):
            runner.tick()  # fire: rent two, bootstrap, join; submit the grid
            with session_scope(database_url) as session:
                sweep = session.scalars(select(Sweep).where(Sweep.schedule_id.isnot(None))).all()[-1]
            assert sweep.state == SweepState.running, sweep.error
            assert len(sim.live()) == 2

            # Train until an arm has a checkpoint in S3; then its node is taken back.
            deadline = time.monotonic() + 300
            while not any(
                r.state == RunState.running and stored_step(database_url, r.id) >= 10
                for r in grid_runs(database_url, sweep.grid_id)
            ):
                assert time.monotonic() < deadline, f"no checkpoint stored; launcher: {log.read_text()[-3000:]}"
                runner.tick()
                time.sleep(0.5)
            runs = grid_runs(database_url, sweep.grid_id)
            first = next(r for r in runs if r.state == RunState.running and stored_step(database_url, r.id) >= 10)
            victim_node = first.nodes[-1]  # run.nodes: the names of the nodes it ran on
            with session_scope(database_url) as session:
                victim_id = session.scalars(
                    select(RentedInstance.instance_id).where(RentedInstance.node_name == victim_node)
                ).one()
            victim = sim.instances[victim_id]
            on_victim = [r.id for r in runs if r.state == RunState.running and r.nodes[-1] == victim_node]
            stored_at_loss = {i: stored_step(database_url, i) for i in on_victim}
            preempted_at = utcnow()
            sim.preempt(victim.id)

            deadline = time.monotonic() + 480
            while True:
                with session_scope(database_url) as session:
                    sweep = session.get_one(Sweep, sweep.id)
                if sweep.state in (SweepState.completed, SweepState.failed, SweepState.stopped):
                    break
                assert time.monotonic() < deadline, f"sweep still {sweep.state}; launcher: {log.read_text()[-3000:]}"
                runner.tick()
                time.sleep(1.0)

        assert sweep.state == SweepState.completed, sweep.error
        with session_scope(database_url) as session:
            runs = list(session.get_one(Grid, sweep.grid_id).runs)
            instances = list(
                session.scalars(
                    select(RentedInstance).where(RentedInstance.sweep_id == sweep.id).order_by(RentedInstance.id)
                )
            )
            kinds = [
                e.kind
                for e in session.scalars(select(Event).where(Event.kind.like("rented.%")).order_by(Event.id))
                if (e.data or {}).get("sweep_id") == sweep.id
            ]
            fetched = {
                r.id: session.scalars(
                    select(Event.data).where(Event.run_id == r.id, Event.kind == "checkpoint.fetched")
                ).all()
                for r in runs
            }
            nodes_left = session.scalars(select(Node)).all()
            when = {
                e.kind: e.time
                for e in session.scalars(
                    select(Event).where(Event.kind.in_(["rented.preempted", "rented.replacement"])).order_by(Event.id)
                )
                if (e.data or {}).get("sweep_id") == sweep.id
            }
            resumed = session.scalars(
                select(Event.time).where(Event.run_id.in_(on_victim), Event.kind == "checkpoint.fetched")
            ).all()
            steps = {r.id: session.scalars(select(Metric.step).where(Metric.run_id == r.id)).all() for r in runs}
        since = lambda t: (t.replace(tzinfo=preempted_at.tzinfo) - preempted_at).total_seconds()  # noqa: E731
        print(
            f"preempted -> found {since(when['rented.preempted']):.1f} s, replacement joined "
            f"{since(when['rented.replacement']):.1f} s, first arm resumed from storage {since(min(resumed)):.1f} s"
        )
        assert {r.state for r in runs} == {RunState.completed}, [(r.arm, r.state, r.error) for r in runs]
        # The arms of the preempted node re-queued. One whose checkpoint was in storage at the loss resumed
        # from it (the arm waited for is one); one whose upload had not finished trained again from step 0
        # (or resumed from a checkpoint whose upload ended after the controller last heard). Every step once.
        assert first.id in on_victim and stored_at_loss[first.id] >= 10
        for run in runs:
            assert sorted(steps[run.id]) == [10, 20, 30, 40], (run.arm, steps[run.id])
            if run.id in on_victim:
                assert run.retries >= 1, run.arm
                if stored_at_loss[run.id]:
                    assert fetched[run.id] and fetched[run.id][0]["step"] >= stored_at_loss[run.id], run.arm
                assert run.nodes[-1] != victim_node, run.nodes
            assert (Path(sweep.results_dir) / "runs" / f"{run.id}-{run.arm}" / "best.pt").is_file()
        # The preempted instance destroyed (confirmed), a replacement rented from the third offer.
        by_offer = {i.offer_id: i for i in instances}
        assert sorted(by_offer) == ["601", "602", "603"]
        preempted = next(i for i in instances if i.instance_id == victim.id)
        assert preempted.state == RentedState.preempted and preempted.destroy_confirmed_at is not None
        assert by_offer["603"].state == RentedState.destroyed
        assert kinds.index("rented.preempted") < kinds.index("rented.replacement")
        assert sim.instances[victim.id].ended is not None
        # Nothing left: no instance at the provider, no namespace node, no node row.
        assert sim.live() == [] and bed.nodes == [] and nodes_left == []
        assert bill_ok(sweep.spend, sim.bill(), [i.price_per_hour for i in instances])


def bill_ok(spend: float, bill: float, prices: list[float]) -> bool:
    """The spend covers the bill and exceeds it by at most a few seconds of each instance's price."""
    return bill <= spend <= bill + sum(prices) * 5 / 3600
