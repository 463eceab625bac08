"""Provider-independent steps of a rental: create (or find what a failed create made), wait until
reachable, destroy until confirmed.

The sweep runner composes them per node (orchestrator/sweeps/rented.py, `_rent_one`): it records each
instance in the database between the create and the wait, and on any failure on the way destroys what
was created, so that a half-made rental never bills on unseen. The SSH check here is only "the port
speaks SSH": the host key is pinned at first contact (orchestrator/fleet/pinning.py) and checked by the
SSH layer (orchestrator/fleet/shell.py), never accepted here.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass

from orchestrator.fleet.providers.base import Instance, InstanceState, LaunchSpec, Offer, Provider, ProviderError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timing:
    """How long to wait for what, in seconds. Defaults fit Vast/RunPod pulling a multi-GB image."""

    reachable_s: float = 900.0  # create -> SSH answers
    poll_s: float = 5.0  # between describe calls
    destroy_s: float = 120.0  # destroy -> provider reports it gone
    connect_s: float = 5.0  # one SSH connection attempt
    # A create that failed -> the instance it may have made anyway shows in the provider's listing.
    find_s: float = 10.0


def ssh_answers(host: str, port: int, timeout_s: float = 5.0) -> bool:
    """True when (host, port) accepts a connection and greets with an SSH banner."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            s.settimeout(timeout_s)
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def wait_reachable(provider: Provider, instance_id: str, timing: Timing) -> Instance:
    """The instance once it runs and its SSH port answers; ProviderError if it is gone, stopped or late."""
    deadline = time.monotonic() + timing.reachable_s
    last: Instance | None = None
    while True:
        last = provider.describe(instance_id)
        if last.state in (InstanceState.gone, InstanceState.stopped, InstanceState.interrupted):
            raise ProviderError(f"{provider.name}: instance {instance_id} is {last.status} before it was reachable")
        endpoint = last.reachable_endpoint
        if endpoint is not None and ssh_answers(*endpoint, timeout_s=timing.connect_s):
            return last
        if time.monotonic() >= deadline:
            where = f"{endpoint[0]}:{endpoint[1]} does not answer SSH" if endpoint else f"status {last.status}"
            raise ProviderError(
                f"{provider.name}: instance {instance_id} not reachable after {timing.reachable_s:g} s ({where})"
            )
        time.sleep(timing.poll_s)


def create_or_find(
    provider: Provider, offer: Offer, spec: LaunchSpec, recorded: set[str], timing: Timing
) -> tuple[list[Instance], ProviderError | None]:
    """`provider.create`, or, when it fails, what it may have made anyway; (instances, the create's error).

    A create the provider accepted can still fail here: its reply lost to a timeout or a 5xx, or the SDK
    retrying it and the retry refused (the offer is taken: by our own first attempt). The instance then
    bills with the sweep's label and no record. So a failed create is followed by a look at the
    provider's listing for live instances with `spec.label` whose id is not in `recorded`, for up to
    `timing.find_s`; the first found is the one to use, any others (an SDK's retry that also succeeded)
    are to destroy. None found: the create's ProviderError is raised (nothing was rented)."""
    try:
        return [provider.create(offer, spec)], None
    except ProviderError as exc:
        failed = exc
    deadline = time.monotonic() + timing.find_s
    while True:
        try:
            owned = provider.list_owned(spec.label.controller_id)
        except ProviderError as exc:
            log.warning("%s: cannot list instances after a failed create: %s", provider.name, exc)
            owned = []
        found = [
            i
            for i in owned
            if i.label == spec.label and i.instance_id not in recorded and i.state is not InstanceState.gone
        ]
        if found:
            return found, failed
        if time.monotonic() >= deadline:
            raise failed
        time.sleep(timing.poll_s)


def destroy_confirmed(provider: Provider, instance_id: str, timing: Timing) -> bool:
    """Destroy and poll until the provider reports it gone; False (and a log line) when not confirmed."""
    deadline = time.monotonic() + timing.destroy_s
    try:
        provider.destroy(instance_id)
        while provider.describe(instance_id).state is not InstanceState.gone:
            if time.monotonic() >= deadline:
                log.error(
                    "%s: destroy of instance %s not confirmed after %g s", provider.name, instance_id, timing.destroy_s
                )
                return False
            time.sleep(timing.poll_s)
    except ProviderError as exc:
        log.error("%s: destroy of instance %s not confirmed: %s", provider.name, instance_id, exc)
        return False
    return True
