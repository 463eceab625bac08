"""A create the provider accepted whose reply was lost: the provider simulator (tests/cluster/provider_sim.py,
through the real vastai SDK) makes the instance, then answers 500 or nothing until the SDK times out (the
SDK then retries the create, and the retry is refused: the offer is taken). Only the provider's HTTP API is
simulated; SSH (the loopback sshd), pinning, bootstrap, the database and the spend are real. The runner must
find the instance by its label and adopt it: no orphan bills unrecorded, and the spend counts it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from orchestrator.db.models import Event
from orchestrator.db.session import session_scope
from orchestrator.fleet.providers.vast import VastProvider
from orchestrator.vocabulary import RentedState, SweepState
from tests.cluster.provider_sim import ProviderSim
from tests.orchestrator.sweeps.renting import KEY, due_schedule, finish_runs, instances_of, rented_runner, sweep_of

pytest.importorskip("vastai", reason="the vastai SDK: pip install --no-deps vastai==1.9.1 runpod==1.12.0")
pytestmark = pytest.mark.usefixtures("quiet_schedules")  # only this test's schedule fires


@pytest.mark.parametrize(("fault", "said"), [("500", "500 Server Error"), ("timeout", "404 Client Error")])
def test_an_ambiguous_create_is_found_by_its_label_adopted_and_counted_in_the_spend(
    database_url: str,
    sshd,  # noqa: ANN001
    sim: ProviderSim,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    fault: str,
    said: str,
) -> None:
    sim.create_faults = [fault]  # the first create: made, then its reply is lost
    name = f"ambiguous-{fault}"
    due_schedule(database_url, name)
    runner = rented_runner(database_url, sshd, sim, tmp_path, sshd.workdir / name)
    runner.rentals.providers["vast"] = VastProvider(KEY, server_url=sim.url, timeout_s=1.0)
    runner.tick()
    sweep = sweep_of(database_url, name)
    assert sweep.state == SweepState.running, sweep.error
    [instance] = instances_of(database_url, sweep.id)  # the one the failed create made, no second rental
    assert (instance.offer_id, instance.state) == ("302", RentedState.running)
    assert instance.label == f"ablate.night.s{sweep.id}"
    assert [i.id for i in sim.live()] == [instance.instance_id] and sweep.nodes == [f"vast-{instance.instance_id}"]
    with session_scope(database_url) as session:
        events = session.scalars(select(Event).where(Event.kind == "rented.adopted")).all()
        [adopted] = [e for e in events if e.data["sweep_id"] == sweep.id]
    assert adopted.data["instance_id"] == instance.instance_id and said in adopted.message
    assert KEY not in adopted.message

    finish_runs(database_url, sweep.grid_id)
    runner.tick()
    sweep = sweep_of(database_url, name)
    assert sweep.state == SweepState.completed, sweep.error
    assert sim.live() == []
    # The spend counts it from before the create that made it until its destroy was confirmed.
    assert sweep.spend >= sim.bill() and sweep.spend - sim.bill() <= 1.2 / 3600
