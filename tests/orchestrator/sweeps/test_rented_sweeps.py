"""Sweeps whose schedule asks for nodes: rented through the real vastai SDK from the provider simulator,
reached over a real OpenSSH server (the loopback sshd: every "instance" answers there), host key pinned
at first contact, bootstrapped, torn down and destroyed; spend against the simulator's bill; an offer
that never becomes reachable replaced; the reaper; a restart mid-provisioning; the key kept out.

The runs' state changes the launcher makes are made directly in the DB, as in test_sweeps.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from orchestrator.app import create_app
from orchestrator.db.models import Event, Node, Schedule, Sweep, utcnow
from orchestrator.db.session import session_scope
from orchestrator.fleet.providers.base import InstanceLabel, LaunchSpec
from orchestrator.fleet.providers.offers import choose_offers
from orchestrator.fleet.providers.request import NodeRequest
from orchestrator.fleet.providers.vast import VastProvider
from orchestrator.settings import Settings
from orchestrator.vocabulary import RentedState, SweepState
from tests.cluster.provider_sim import UNREACHABLE, Hooks, ProviderSim, SimInstance
from tests.orchestrator.sweeps.renting import (
    KEY,
    OFFERS,
    due_schedule,
    finish_runs,
    instance_ids,
    instances_of,
    rented_runner,
    sweep_of,
)

pytest.importorskip("vastai", reason="the vastai SDK: pip install --no-deps vastai==1.9.1 runpod==1.12.0")
pytestmark = pytest.mark.usefixtures("quiet_schedules")  # only this test's schedule fires

def test_a_request_sweep_rents_pins_runs_and_destroys_with_spend_equal_to_the_bill(
    database_url: str,
    sshd,  # noqa: ANN001
    sim: ProviderSim,
    tmp_path: Path,
) -> None:
    remote = sshd.workdir / "rented"
    due_schedule(database_url, "rent-one")
    runner = rented_runner(database_url, sshd, sim, tmp_path, remote)
    runner.tick()  # fire: search, rent the cheapest fitting offer, pin, register, bootstrap
    sweep = sweep_of(database_url, "rent-one")
    assert sweep.state == SweepState.running, sweep.error
    [instance] = instances_of(database_url, sweep.id)
    assert (instance.offer_id, instance.state, instance.price_per_hour) == ("302", RentedState.running, 1.2)
    assert instance.label == f"ablate.night.s{sweep.id}" == sim.instances[instance.instance_id].label
    assert sweep.nodes == [f"vast-{instance.instance_id}"] and sweep.price_per_hour == 1.2
    assert (remote / "joined").read_text().split() == ["4"]
    # The host key offered at first contact, and only for this instance, is what the node row trusts.
    with session_scope(database_url) as session:
        node = session.scalars(select(Node).where(Node.name == sweep.nodes[0])).one()
        pinned = Path(node.known_hosts_path)
        pinned_event = session.scalars(select(Event).where(Event.kind == "rented.host_key_pinned")).one()
    host_key = sshd.host_key_pub.read_text().split()[:2]
    assert pinned.read_text().split() == [f"[127.0.0.1]:{sshd.port}", *host_key]
    assert pinned.stat().st_mode & 0o077 == 0 and pinned.parent == tmp_path / "known_hosts"
    assert instance.host_key == pinned_event.data["fingerprint"] and instance.host_key in pinned_event.message

    finish_runs(database_url, sweep.grid_id)
    runner.tick()  # collect, tear down, destroy
    sweep = sweep_of(database_url, "rent-one")
    assert sweep.state == SweepState.completed, sweep.error
    [instance] = instances_of(database_url, sweep.id)
    assert instance.state == RentedState.destroyed and instance.destroy_confirmed_at is not None
    assert sim.live() == [] and not remote.exists()
    with session_scope(database_url) as session:  # the machine is gone: so is its node row
        assert session.scalar(select(Node).where(Node.name == sweep.nodes[0])) is None
    # The bill ran from create to destroy inside the controller's create -> destroy-confirmed span.
    assert sweep.spend >= sim.bill() and sweep.spend - sim.bill() <= 1.2 / 3600


def test_an_offer_that_never_becomes_reachable_is_destroyed_and_the_next_one_rented(
    database_url: str,
    sshd,  # noqa: ANN001
    tmp_path: Path,
) -> None:
    # The first instance sits at an address that never answers; the rest at the sshd.
    made: list[SimInstance] = []

    def on_create(inst: SimInstance) -> tuple[str, int]:
        made.append(inst)
        return UNREACHABLE if len(made) == 1 else (sshd.host, sshd.port)

    offers = [dict(o) for o in OFFERS]
    with ProviderSim(KEY, vast_offers=offers, hooks=Hooks(on_create), first_vast_id=next(instance_ids)) as sim:
        remote = sshd.workdir / "replaced"
        due_schedule(database_url, "rent-replace")
        runner = rented_runner(database_url, sshd, sim, tmp_path, remote)
        runner.tick()
        sweep = sweep_of(database_url, "rent-replace")
        assert sweep.state == SweepState.running, sweep.error
        first, second = instances_of(database_url, sweep.id)
        assert (first.offer_id, first.state) == ("302", RentedState.failed)  # the cheapest, never reachable
        assert "not reachable" in first.last_error and first.destroy_confirmed_at is not None
        assert (second.offer_id, second.state) == ("303", RentedState.running)  # the next cheapest
        assert [i.live for i in made] == [False, True]
        finish_runs(database_url, sweep.grid_id)
        runner.tick()
        sweep = sweep_of(database_url, "rent-replace")
        assert sweep.state == SweepState.completed and sim.live() == []
        # The failed rental billed too (create -> destroy): the spend counts both, as the provider does.
        assert sweep.spend >= sim.bill() and sweep.spend - sim.bill() <= (1.2 + 1.4) / 3600


def test_the_reaper_destroys_our_instances_no_live_sweep_owns_and_a_restart_leaks_nothing(
    database_url: str,
    sshd,  # noqa: ANN001
    sim: ProviderSim,
    tmp_path: Path,
) -> None:
    provider = VastProvider(KEY, server_url=sim.url)
    request = NodeRequest(provider="vast", gpu="RTX_4090", nodes=3, max_price_per_gpu_hour=0.45)
    offers = choose_offers(provider.search(request), request)

    def create(offer_index: int, controller: str, sweep_id: int) -> str:
        spec = LaunchSpec("img", 50, "ssh-ed25519 AAAA test", InstanceLabel(controller, sweep_id))
        return provider.create(offers[offer_index], spec).instance_id

    # A controller killed mid-provisioning: its sweep is still provisioning, and it had created one
    # instance it never recorded. A finished sweep's instance whose destroy failed. Another controller's.
    dead_schedule = due_schedule(database_url, "rent-ended")
    with session_scope(database_url) as session:
        session.get_one(Schedule, dead_schedule).paused = True
        dead = Sweep(schedule_id=dead_schedule, scheduled_for=utcnow(), fired_at=utcnow(), state=SweepState.failed)
        session.add(dead)
        session.flush()
        dead_id = dead.id
    orphan = create(0, "night", dead_id)
    others = create(1, "day", dead_id)
    due_schedule(database_url, "rent-restart")
    runner = rented_runner(database_url, sshd, sim, tmp_path, sshd.workdir / "restart")
    runner.fire_due(utcnow())
    interrupted_sweep = sweep_of(database_url, "rent-restart").id
    half_made = create(2, "night", interrupted_sweep)  # offer 304: rented, never recorded

    runner.tick()  # the restarted controller's first tick
    assert not sim.instances[orphan].live  # reaped: its sweep is not live
    assert sim.instances[others].live  # another controller's instance is never touched
    assert not sim.instances[half_made].live  # the interrupted attempt's rental, released before renting anew
    with session_scope(database_url) as session:
        reaped = session.scalars(select(Event).where(Event.kind == "rented.reaped")).all()
    assert [e.data["instance_id"] for e in reaped] == [orphan]
    sweep = sweep_of(database_url, "rent-restart")
    assert sweep.state == SweepState.running, sweep.error
    [instance] = instances_of(database_url, sweep.id)  # rented afresh, from what is still on offer
    assert instance.state == RentedState.running and instance.offer_id == "301"
    with session_scope(database_url) as session:
        session.get_one(Sweep, sweep.id).state = SweepState.failed  # as if it ended without its runner
    runner.tick()
    assert [i.id for i in sim.live()] == [others]  # the next tick reaps what the ended sweep left
    provider.destroy(others)


def test_no_api_key_in_any_event_or_response(
    database_url: str,
    sshd,  # noqa: ANN001
    sim: ProviderSim,
    tmp_path: Path,
) -> None:
    # A sweep that rents and fails (bootstrap's start exits 3 on every offer) writes events of every kind.
    runner = rented_runner(database_url, sshd, sim, tmp_path, sshd.workdir / "secret")
    runner.node_config = runner.node_config.model_copy(update={"start": ["exit 3"]})  # type: ignore[union-attr]
    due_schedule(database_url, "rent-secret")
    runner.tick()
    sweep = sweep_of(database_url, "rent-secret")
    assert sweep.state == SweepState.failed and "3 rentals failed" in sweep.error and sim.live() == []
    with session_scope(database_url) as session:
        events = session.scalars(select(Event)).all()
        texts = [json.dumps({"m": e.message, "d": e.data}) for e in events]
    assert any("rented.destroyed" == e.kind for e in events) and all(KEY not in t for t in texts)
    settings = Settings(database_url=database_url, vast_api_key=KEY, home_dir=tmp_path)  # type: ignore[arg-type]
    client = TestClient(create_app(settings, "tok"))
    auth = {"Authorization": "Bearer tok"}
    for path in ("/api/schedules", "/api/schedules/rent-secret", "/"):
        answer = client.get(path, headers=auth)
        assert answer.status_code == 200 and KEY not in answer.text


def test_a_destroy_not_confirmed_is_red_on_the_dashboard_and_rest_until_the_reaper_ends_it(
    database_url: str,
    sshd,  # noqa: ANN001
    sim: ProviderSim,
    tmp_path: Path,
) -> None:
    runner = rented_runner(database_url, sshd, sim, tmp_path, sshd.workdir / "unconfirmed")
    due_schedule(database_url, "rent-red")
    runner.tick()
    sweep = sweep_of(database_url, "rent-red")
    assert sweep.state == SweepState.running, sweep.error
    # The provider stops accepting the key before the end (revoked, an outage): destroy cannot be confirmed.
    runner.rentals.providers["vast"] = VastProvider("sk-revoked-000000000000", server_url=sim.url)
    finish_runs(database_url, sweep.grid_id)
    runner.tick()
    sweep = sweep_of(database_url, "rent-red")
    assert sweep.state == SweepState.failed and "IT MAY STILL BE BILLING" in sweep.error
    [instance] = instances_of(database_url, sweep.id)
    assert instance.state == RentedState.destroy_failed and len(sim.live()) == 1

    client = TestClient(create_app(Settings(database_url=database_url, home_dir=tmp_path), "tok"))
    auth = {"Authorization": "Bearer tok"}
    [public] = client.get("/api/schedules/rent-red", headers=auth).json()["sweeps"][0]["instances"]
    assert (public["instance_id"], public["state"]) == (instance.instance_id, "destroy_failed")
    assert public["destroy_unconfirmed"] and public["price_per_hour"] == 1.2 and public["cost_so_far"] > 0
    assert public["host_key"].startswith("SHA256:") and public["offer_id"] == "302"
    page = client.get("/").text
    assert 'id="unconfirmed-destroys"' in page and f"vast {instance.instance_id}" in page
    assert f'class="chip rented rented-destroy_failed" data-instance="vast-{instance.instance_id}"' in page
    assert "DESTROY NOT CONFIRMED" in page

    runner.rentals.providers["vast"] = VastProvider(KEY, server_url=sim.url)  # the key works again
    runner.tick()  # the reaper: labelled, and its sweep is not live
    assert sim.live() == []
    [instance] = instances_of(database_url, sweep.id)
    assert instance.state == RentedState.destroyed and instance.destroy_confirmed_at is not None
    assert 'id="unconfirmed-destroys"' not in client.get("/").text
