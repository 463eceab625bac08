"""What this controller has rented now, asked of every provider with an API key configured on it, and ending
one rental: GET /api/instances and DELETE /api/instances/{provider}/{id}, which `ablate instances` asks.

The keys and the controller's id (ABLATE_CONTROLLER_ID, else its database's) are the controller's, so the
answer is the same whichever machine asks."""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel

from orchestrator.errors import Conflict
from orchestrator.fleet.providers.base import Instance, InstanceState, ProviderError
from orchestrator.fleet.providers.request import RENTING
from orchestrator.settings import Settings


class OwnedInstance(BaseModel):
    """One instance as its provider describes it now, with what it has billed so far."""

    provider: str
    instance_id: str
    sweep_id: int | None  # the sweep that rented it, from its label
    state: InstanceState
    status: str  # the provider's own word for it
    gpus: int
    price_per_hour: float
    cost_so_far: float | None  # None where the provider gives no start
    ssh: str | None  # user@host:port once published

    @classmethod
    def of(cls, i: Instance, now: float) -> OwnedInstance:
        ssh = f"{i.ssh_user}@{i.ssh_host}:{i.ssh_port}" if i.ssh_host else None
        return cls(provider=i.provider, instance_id=i.instance_id, sweep_id=i.label.sweep_id if i.label else None,
                   state=i.state, status=i.status, gpus=i.gpus, price_per_hour=i.price_per_hour,
                   cost_so_far=i.cost_so_far(now), ssh=ssh)


class OwnedInstances(BaseModel):
    controller_id: str
    providers: list[str]  # the providers asked: those with an API key configured on the controller
    instances: list[OwnedInstance]


class InstanceDestroyed(BaseModel):
    provider: str
    instance_id: str
    outcome: Literal["destroyed", "already_gone"]


class NotRentedHere(Conflict):
    """An instance another controller (or a person) rented: not destroyed unless forced (HTTP 409)."""


def owned_instances(settings: Settings) -> OwnedInstances:
    """Every live instance labelled with this controller's id, on every provider it has a key for."""
    from orchestrator.fleet.providers import provider_for
    from orchestrator.fleet.providers.credentials import MissingApiKey
    from orchestrator.fleet.providers.identity import controller_id

    ours, now = controller_id(settings), time.time()
    asked: list[str] = []
    found: list[OwnedInstance] = []
    for name in RENTING:
        try:
            provider = provider_for(name, settings)
        except MissingApiKey:
            continue  # not configured: nothing can have been rented there
        asked.append(name)
        found += [OwnedInstance.of(i, now) for i in provider.list_owned(ours)]
    return OwnedInstances(controller_id=ours, providers=asked, instances=found)


def destroy_instance(settings: Settings, provider_name: str, instance_id: str, force: bool) -> InstanceDestroyed:
    """Destroy one instance and wait until the provider confirms it gone. One labelled by another controller,
    or not by ablate, is refused unless `force`: the account may be shared, and an id mistyped by one digit is
    someone else's machine."""
    from orchestrator.fleet.providers import provider_for
    from orchestrator.fleet.providers.identity import controller_id
    from orchestrator.fleet.providers.lifecycle import Timing, destroy_confirmed

    provider = provider_for(provider_name, settings)
    found = provider.describe(instance_id)
    if found.state is InstanceState.gone:
        return InstanceDestroyed(provider=provider_name, instance_id=instance_id, outcome="already_gone")
    ours = controller_id(settings)
    if not force and (found.label is None or found.label.controller_id != ours):
        whose = "no ablate label" if found.label is None else f"label {found.label.encode()}"
        raise NotRentedHere(f"{provider_name} instance {instance_id} has {whose}: not rented by this controller "
                            f"({ours}); not destroyed (--force destroys it anyway; force=true over the API)")
    if not destroy_confirmed(provider, instance_id, Timing(poll_s=2.0)):
        raise ProviderError(f"{provider_name} instance {instance_id}: destroy NOT confirmed; check the provider's "
                            "console")
    return InstanceDestroyed(provider=provider_name, instance_id=instance_id, outcome="destroyed")
