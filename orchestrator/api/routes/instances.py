"""Instances: what this controller rented now, asked of the providers with its own keys, and ending one.

A provider that fails answers 424 with its one line (never the key); an instance this controller did not
rent is refused with 409 unless `force`. Errors are mapped in orchestrator/api/errors.py.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from orchestrator.fleet.providers.owned import InstanceDestroyed, OwnedInstances, destroy_instance, owned_instances
from orchestrator.fleet.providers.request import RENTING
from orchestrator.web.deps import AUTH_RESPONSES, AuthDep, SettingsDep

router = APIRouter(prefix="/api/instances", tags=["instances"])

RentingProvider = Literal[RENTING]  # type: ignore[valid-type]  # "vast", "runpod": the one list is RENTING
_424 = {424: {"description": "the provider failed, or did not confirm the destroy"}}


@router.get("", response_model=OwnedInstances, responses={**AUTH_RESPONSES, **_424})
def get_instances(settings: SettingsDep, _: AuthDep) -> OwnedInstances:
    """Every live instance labelled with this controller's id, on each provider with a key configured here
    (`providers` names those asked), with its cost so far."""
    return owned_instances(settings)


@router.delete(
    "/{provider}/{instance_id}",
    response_model=InstanceDestroyed,
    responses={**AUTH_RESPONSES, **_424, 409: {"description": "not rented by this controller (force ends it)"}},
)
def delete_instance(
    provider: RentingProvider,
    instance_id: str,
    settings: SettingsDep,
    _: AuthDep,
    force: Annotated[bool, Query(description="Destroy it even if it is not labelled by this controller")] = False,
) -> InstanceDestroyed:
    """Destroy the instance and answer once the provider confirms it gone (an instance gone already is no
    error: `outcome` says which)."""
    return destroy_instance(settings, provider, instance_id, force)
