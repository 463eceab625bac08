"""Two controllers, each with its own fresh database and no ABLATE_CONTROLLER_ID, renting from one provider
account: the provider's HTTP API is simulated (tests/cluster/provider_sim.py, through the real vastai SDK);
everything behind it (SSH to the loopback sshd, host-key pinning, bootstrap, the reaper, the database) is
real. Both databases number their first sweep 1, so the labels differ only in the controller's id.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import select

from orchestrator.db.models import Event
from orchestrator.db.session import session_scope, upgrade
from orchestrator.fleet.providers.base import CONTROLLER_ID_PATTERN, InstanceLabel
from orchestrator.settings import Settings
from orchestrator.sweeps.rented import rental_config
from orchestrator.sweeps.runner import SweepRunner
from orchestrator.vocabulary import RentedState, SweepState
from tests.cluster.provider_sim import ProviderSim
from tests.orchestrator.sweeps.renting import due_schedule, finish_runs, instances_of, rented_runner, sweep_of

pytest.importorskip("vastai", reason="the vastai SDK: pip install --no-deps vastai==1.9.1 runpod==1.12.0")


def _controller(tag: str, sshd, provider_sim: ProviderSim, tmp_path: Path) -> tuple[str, SweepRunner]:  # noqa: ANN001
    """A fresh installation: its own database and storage, its controller id as settings make it."""
    url = f"sqlite:///{tmp_path / tag}.db"
    upgrade(url)
    settings = Settings(database_url=url, home_dir=tmp_path / tag)  # type: ignore[call-arg]
    assert settings.controller_id is None  # nothing set: the installation's own id
    runner = rented_runner(url, sshd, provider_sim, tmp_path / tag, sshd.workdir / f"two-{tag}")
    assert runner.rentals.config is not None
    runner.rentals.config = replace(runner.rentals.config, controller_id=rental_config(settings).controller_id)
    return url, runner


def test_two_controllers_on_one_account_never_reap_each_other(
    sshd,  # noqa: ANN001
    sim: ProviderSim,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    first_db, first = _controller("first", sshd, sim, tmp_path)
    second_db, second = _controller("second", sshd, sim, tmp_path)
    ids = [r.rentals.config.controller_id for r in (first, second)]  # type: ignore[union-attr]
    assert ids[0] != ids[1] and all(re.match(CONTROLLER_ID_PATTERN, i) for i in ids)
    # Generated once: the next read (a restart, `ablate schedules run` beside `ablate serve`) gets the same id.
    again = rental_config(Settings(database_url=first_db, home_dir=tmp_path / "first"))  # type: ignore[call-arg]
    assert again.controller_id == ids[0]

    due_schedule(first_db, "night-first")
    first.tick()
    sweep_a = sweep_of(first_db, "night-first")
    assert sweep_a.state == SweepState.running, sweep_a.error
    [rented_a] = instances_of(first_db, sweep_a.id)

    due_schedule(second_db, "night-second")
    second.tick()  # its first tick reaps what no live sweep of its own owns, then rents
    sweep_b = sweep_of(second_db, "night-second")
    assert sweep_b.state == SweepState.running, sweep_b.error
    [rented_b] = instances_of(second_db, sweep_b.id)
    assert sweep_a.id == sweep_b.id  # sweep 1 in both databases
    assert InstanceLabel.decode(sim.instances[rented_a.instance_id].label) == InstanceLabel(ids[0], sweep_a.id)
    assert InstanceLabel.decode(sim.instances[rented_b.instance_id].label) == InstanceLabel(ids[1], sweep_b.id)

    first.tick()  # the first controller's reaper lists the account too
    second.tick()
    assert {i.id for i in sim.live()} == {rented_a.instance_id, rented_b.instance_id}
    for url in (first_db, second_db):
        with session_scope(url) as session:
            assert session.scalars(select(Event).where(Event.kind == "rented.reaped")).all() == []

    # Each ends its own sweep and destroys its own instance only.
    finish_runs(first_db, sweep_a.grid_id)
    first.tick()
    assert sweep_of(first_db, "night-first").state == SweepState.completed
    assert [i.id for i in sim.live()] == [rented_b.instance_id]
    finish_runs(second_db, sweep_b.grid_id)
    second.tick()
    assert sweep_of(second_db, "night-second").state == SweepState.completed and sim.live() == []
    assert [i.state for i in instances_of(second_db, sweep_b.id)] == [RentedState.destroyed]
