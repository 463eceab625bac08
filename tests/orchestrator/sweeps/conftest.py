"""Fixtures of the rented-sweep tests: the provider simulator answering at the loopback sshd, and only the
test's own schedule firing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import select

from orchestrator.db.models import Schedule
from orchestrator.db.session import session_scope
from tests.cluster.provider_sim import Hooks, ProviderSim
from tests.orchestrator.sweeps.renting import KEY, OFFERS, instance_ids


@pytest.fixture
def quiet_schedules(database_url: str) -> None:
    """Only this test's schedule fires: earlier tests' schedules are paused."""
    with session_scope(database_url) as session:
        for schedule in session.scalars(select(Schedule)):
            schedule.paused = True


@pytest.fixture
def sim(sshd) -> Iterator[ProviderSim]:  # noqa: ANN001
    """Every instance answers at the loopback sshd; the controller's key is the sshd's client key."""
    first_id = next(instance_ids)
    hooks = Hooks(lambda i: (sshd.host, sshd.port))
    with ProviderSim(KEY, vast_offers=[dict(o) for o in OFFERS], hooks=hooks, first_vast_id=first_id) as s:
        yield s
