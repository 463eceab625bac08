"""Providers of rented nodes: `static` (registered by hand), `vast` (Vast.ai), `runpod` (RunPod).

`provider_for(name, settings)` builds one from settings (its API key included); the rest of the
controller talks to it only through `base.Provider`. See base.py for the records, request.py for what
a schedule asks (and the provider names), offers.py for the offer choice, lifecycle.py for the steps of
a rental (create, wait until reachable, destroy until confirmed), liveness.py for when a rented node counts
as lost, reaper.py for what no live sweep owns, credentials.py for the API keys and identity.py for this
controller's id and SSH key on what it rents.
"""

from __future__ import annotations

from orchestrator.fleet.providers.base import Provider, ProviderError
from orchestrator.fleet.providers.request import PROVIDERS, REGISTERED, RENTING
from orchestrator.settings import Settings


def provider_for(name: str, settings: Settings) -> Provider:
    """The provider `name` configured from `settings`; ProviderError naming the fix when it cannot be."""
    from orchestrator.fleet.providers.credentials import api_key

    if name == REGISTERED:
        from orchestrator.fleet.providers.static import StaticProvider

        return StaticProvider(settings.database_url)
    if name == "vast":
        from orchestrator.fleet.providers.vast import VastProvider

        return VastProvider(api_key(settings, "vast"), server_url=settings.vast_url)
    if name == "runpod":
        from orchestrator.fleet.providers.runpod import RunPodProvider

        return RunPodProvider(api_key(settings, "runpod"), api_url=settings.runpod_api_url)
    raise ProviderError(f"unknown provider {name!r}; one of {', '.join(PROVIDERS)}")


def configured_providers(settings: Settings) -> dict[str, Provider]:
    """The renting providers that have an API key configured: what sweeps may rent from and what the
    reaper lists every tick."""
    from orchestrator.fleet.providers.credentials import MissingApiKey

    found: dict[str, Provider] = {}
    for name in RENTING:
        try:
            found[name] = provider_for(name, settings)
        except MissingApiKey:
            continue
    return found
