"""A rented interruptible node preempted mid-sweep, at the unit level: the provider simulator (through the
real vastai SDK) reports the interruptible instance `stopped` (outbid, as Vast documents it); the next tick
marks it `preempted`, destroys it until
confirmed, drops its node from the sweep, and rents a replacement through the fire path when the budget
allows, and not when it does not. Every "instance" answers at the loopback sshd (tests/conftest.py);
the runs' state changes are made in the DB as in test_rented_sweeps.py. Arms resuming from checkpoint
storage on the test bed: tests/cluster/test_rented_preemption.py.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from orchestrator.db.models import Event, Node, utcnow
from orchestrator.db.session import session_scope
from orchestrator.vocabulary import RentedState, SweepState
from tests.cluster.provider_sim import ProviderSim
from tests.kit.clock import FakeClock
from tests.orchestrator.sweeps.renting import due_schedule, finish_runs, instances_of, rented_runner, sweep_of

pytest.importorskip("vastai", reason="the vastai SDK: pip install --no-deps vastai==1.9.1 runpod==1.12.0")
pytestmark = pytest.mark.usefixtures("quiet_schedules")  # only this test's schedule fires


def _kinds(database_url: str, sweep_id: int) -> list[str]:
    with session_scope(database_url) as session:
        events = session.scalars(select(Event).where(Event.kind.like("rented.%")).order_by(Event.id))
        return [e.kind for e in events if (e.data or {}).get("sweep_id") == sweep_id]


def test_a_preempted_instance_is_destroyed_and_replaced_while_the_budget_allows(
    database_url: str,
    sshd,  # noqa: ANN001
    sim: ProviderSim,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    due_schedule(database_url, "preempt-replace", interruptible=True)
    runner = rented_runner(database_url, sshd, sim, tmp_path, sshd.workdir / "preempt-replace")
    runner.tick()  # fire: rent the cheapest offer (302)
    sweep = sweep_of(database_url, "preempt-replace")
    assert sweep.state == SweepState.running, sweep.error
    [first] = instances_of(database_url, sweep.id)
    sim.preempt(first.instance_id)  # Vast: actual_status stopped, intended running, a bid
    runner.tick()  # found preempted, destroyed, replaced by the next cheapest offer (303)
    sweep = sweep_of(database_url, "preempt-replace")
    assert sweep.state == SweepState.running, sweep.error
    first, second = instances_of(database_url, sweep.id)
    assert (first.state, first.node_name) == (RentedState.preempted, None)
    assert first.destroy_confirmed_at is not None and not sim.instances[first.instance_id].live
    assert (second.offer_id, second.state) == ("303", RentedState.running)
    assert sweep.nodes == [f"vast-{second.instance_id}"] and sweep.price_per_hour == second.price_per_hour
    with session_scope(database_url) as session:
        assert session.scalar(select(Node).where(Node.name == f"vast-{first.instance_id}")) is None
    kinds = _kinds(database_url, sweep.id)
    assert kinds.index("rented.preempted") < kinds.index("rented.replacement")
    assert "rented.no_replacement" not in kinds

    finish_runs(database_url, sweep.grid_id)
    runner.tick()
    sweep = sweep_of(database_url, "preempt-replace")
    assert sweep.state == SweepState.completed, sweep.error
    assert sim.live() == []
    # Both rentals billed (the preempted one until its destroy was confirmed); the spend counts both.
    assert (
        sweep.spend >= sim.bill() and sweep.spend - sim.bill() <= (first.price_per_hour + second.price_per_hour) / 3600
    )


def test_no_replacement_when_the_budget_left_would_not_pay_for_it(
    database_url: str,
    sshd,  # noqa: ANN001
    sim: ProviderSim,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    # 0.2 left pays a replacement at the request's cap (4 x 0.45/h; no node survives) for under 7 minutes:
    # less than the 10 a replacement must have.
    due_schedule(database_url, "preempt-broke", interruptible=True)
    with session_scope(database_url) as session:
        from orchestrator.db.models import Schedule

        session.scalars(select(Schedule).where(Schedule.name == "preempt-broke")).one().budget = 0.2
    runner = rented_runner(database_url, sshd, sim, tmp_path, sshd.workdir / "preempt-broke")
    runner.tick()
    sweep = sweep_of(database_url, "preempt-broke")
    assert sweep.state == SweepState.running, sweep.error
    [first] = instances_of(database_url, sweep.id)
    sim.preempt(first.instance_id)
    runner.tick()
    sweep = sweep_of(database_url, "preempt-broke")
    [first] = instances_of(database_url, sweep.id)  # nothing new rented
    assert first.state == RentedState.preempted and first.destroy_confirmed_at is not None
    assert sweep.nodes == [] and sim.live() == []
    kinds = _kinds(database_url, sweep.id)
    assert "rented.preempted" in kinds and "rented.no_replacement" in kinds and "rented.replacement" not in kinds
    with session_scope(database_url) as session:
        why = session.scalars(select(Event).where(Event.kind == "rented.no_replacement")).all()[-1].message
    assert "budget left" in why
    finish_runs(database_url, sweep.grid_id)  # (the launcher would keep them queued until the budget ends)
    runner.tick()
    assert sweep_of(database_url, "preempt-broke").state == SweepState.completed
    assert sim.live() == []


def test_a_preemption_recorded_before_a_crash_is_destroyed_and_replaced_at_the_next_tick(
    database_url: str,
    sshd,  # noqa: ANN001
    sim: ProviderSim,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    due_schedule(database_url, "preempt-crash", interruptible=True)
    runner = rented_runner(database_url, sshd, sim, tmp_path, sshd.workdir / "preempt-crash")
    runner.tick()
    sweep = sweep_of(database_url, "preempt-crash")
    [first] = instances_of(database_url, sweep.id)
    sim.preempt(first.instance_id)
    # What the first transaction of a preemption leaves when the controller dies before the destroy.
    with session_scope(database_url) as session:
        from orchestrator.db.models import RentedInstance, Sweep

        row = session.get_one(RentedInstance, first.id)
        node = session.scalar(select(Node).where(Node.name == row.node_name))
        session.delete(node)
        session.get_one(Sweep, sweep.id).nodes = []
        row.state, row.node_name = RentedState.preempted, None
    restarted = rented_runner(database_url, sshd, sim, tmp_path, sshd.workdir / "preempt-crash")
    restarted.tick()
    first, second = instances_of(database_url, sweep.id)  # destroyed, then the replacement it never got
    assert first.state == RentedState.preempted and first.destroy_confirmed_at is not None
    assert second.state == RentedState.running and sweep_of(database_url, "preempt-crash").nodes == [
        f"vast-{second.instance_id}"
    ]
    assert not sim.instances[first.instance_id].live
    finish_runs(database_url, sweep.grid_id)
    restarted.tick()
    assert sweep_of(database_url, "preempt-crash").state == SweepState.completed
    assert sim.live() == []


def test_a_60_second_offline_blip_keeps_an_on_demand_node_and_a_long_outage_loses_it(
    database_url: str,
    sshd,  # noqa: ANN001
    sim: ProviderSim,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    due_schedule(database_url, "offline-blip")  # on-demand: Vast never takes it back
    runner = rented_runner(database_url, sshd, sim, tmp_path, sshd.workdir / "offline-blip")
    clock = FakeClock(utcnow())
    runner.clock = clock  # the runner's (and its rentals') clock: readings are 30 s apart without waiting
    runner.tick()
    sweep = sweep_of(database_url, "offline-blip")
    assert sweep.state == SweepState.running, sweep.error
    [rented] = instances_of(database_url, sweep.id)
    node = f"vast-{rented.instance_id}"

    sim.set_offline(rented.instance_id, True)  # the host drops off: Vast reports `offline`
    for _ in range(3):  # readings at 0, 30 and 60 s
        runner.tick()
        clock.now += timedelta(seconds=30)
    sim.set_offline(rented.instance_id, False)
    runner.tick()  # 90 s: running again
    [rented] = instances_of(database_url, sweep.id)
    assert rented.state == RentedState.running and sim.instances[rented.instance_id].live
    assert sweep_of(database_url, "offline-blip").nodes == [node]
    assert _kinds(database_url, sweep.id)[-2:] == ["rented.down", "rented.up"]
    assert "rented.preempted" not in _kinds(database_url, sweep.id)

    sim.set_offline(rented.instance_id, True)  # this time it stays away
    for _ in range(10):  # readings at 0, 60, ..., 540 s: kept
        runner.tick()
        clock.now += timedelta(seconds=60)
        assert instances_of(database_url, sweep.id)[0].state == RentedState.running
    runner.tick()  # 600 s: an on-demand node's limit
    first, second = instances_of(database_url, sweep.id)
    assert first.state == RentedState.preempted and not sim.instances[first.instance_id].live
    assert second.state == RentedState.running and sweep_of(database_url, "offline-blip").nodes == [
        f"vast-{second.instance_id}"
    ]
    with session_scope(database_url) as session:
        [why] = [e.message for e in session.scalars(select(Event).where(Event.kind == "rented.preempted"))
                 if e.data["sweep_id"] == sweep.id]
    assert "lost: status offline for 11 readings over 600 s: the limit for an on-demand node" in why
    finish_runs(database_url, sweep.grid_id)
    runner.tick()
    assert sweep_of(database_url, "offline-blip").state == SweepState.completed and sim.live() == []
