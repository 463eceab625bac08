"""What every provider of rented nodes offers: the records and the one small interface.

One module per provider (`static`, `vast`, `runpod`) implements `Provider`; the sweep runner and the
CLI never know which one they talk to (SkyPilot's `sky/provision/<cloud>/instance.py` idea, here
through each provider's official SDK). Everything a provider returns is one of the frozen records
below, never an SDK's raw dict, so a field the runner reads means the same on every provider.

Secrets: a provider holds its API key and never shows it: not in its repr, not in an error (every
SDK error is re-raised as ProviderError with the key scrubbed and the SDK's exception chain, whose
request object carries the Authorization header, dropped).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from orchestrator.fleet.providers.request import NodeRequest

LABEL_PREFIX = "ablate"
CONTROLLER_ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,31}$"
_LABEL_RE = re.compile(r"^ablate\.(?P<controller>[a-z0-9][a-z0-9-]{0,31})\.s(?P<sweep>\d{1,12})$")


class ProviderError(RuntimeError):
    """A provider call that failed; one line naming the provider and the operation, never the API key."""


class NoFittingOffer(ProviderError):
    """Fewer offers fit the request than it asks nodes; the message counts why the others did not fit."""


class InstanceState(StrEnum):
    """A rented instance as the provider reports it, reduced to what the runner acts on."""

    pending = "pending"  # created, image loading / booting: not reachable yet
    running = "running"  # the provider says it runs (SSH may still be starting)
    stopped = "stopped"  # exited / stopped: may still bill for disk (docs/operations.md per provider)
    # Taken back by the provider, as it documents it (a Vast bid outbid: stopped while meant to run).
    interrupted = "interrupted"
    unreachable = "unreachable"  # the provider lost contact with the host (Vast offline): it may come back
    gone = "gone"  # destroyed, or never existed: bills nothing
    unknown = "unknown"  # a status this code does not know; shown raw in `Instance.status`


@dataclass(frozen=True)
class InstanceLabel:
    """Who rented an instance: this controller and the sweep. Encoded as `ablate.<controller>.s<sweep>`,
    which fits Vast's free-text label and a RunPod pod name alike; the reaper matches on it."""

    controller_id: str
    sweep_id: int

    def __post_init__(self) -> None:
        if not re.match(CONTROLLER_ID_PATTERN, self.controller_id):
            raise ValueError(f"controller_id {self.controller_id!r} must match {CONTROLLER_ID_PATTERN}")
        if self.sweep_id < 0:
            raise ValueError("sweep_id must be >= 0")

    def encode(self) -> str:
        return f"{LABEL_PREFIX}.{self.controller_id}.s{self.sweep_id}"

    @classmethod
    def decode(cls, text: str | None) -> InstanceLabel | None:
        """The label in `text`, or None for an instance ablate did not rent (labelled otherwise or not at all)."""
        m = _LABEL_RE.match(text or "")
        return cls(m["controller"], int(m["sweep"])) if m else None


@dataclass(frozen=True)
class Offer:
    """One thing a provider would rent us now: a Vast machine offer, a RunPod GPU type in one cloud, a
    registered static node. Prices in the provider's currency (USD) per hour."""

    provider: str
    offer_id: str  # what `Provider.create` takes back
    gpu_name: str  # as the provider spells it ("RTX 4090", "NVIDIA GeForce RTX 4090")
    gpus: int
    price_per_hour: float  # the whole node, what the provider bills
    reliability: float | None = None  # Vast's 0..1 score; None where the provider publishes none
    cuda: float | None = None  # highest CUDA version the host driver supports
    disk_gb: float | None = None  # disk the host can give; None: any size the request asks
    interruptible: bool = False
    # How many nodes this one offer can become: 1 for a Vast machine or a static node; None for a RunPod
    # GPU type, from which the provider places each pod on some machine of its own choosing.
    capacity: int | None = 1
    where: str = ""  # region / datacenter, for the table a person reads

    @property
    def price_per_gpu_hour(self) -> float:
        return self.price_per_hour / self.gpus if self.gpus else float("inf")


@dataclass(frozen=True)
class LaunchSpec:
    """What to start on a rented instance. `ssh_public_key` is the controller's: the only key let in."""

    image: str
    disk_gb: int
    ssh_public_key: str
    label: InstanceLabel
    # Non-secret environment for the instance (the sweep id, a deadline); never an API key: the provider
    # shows it in its console and the instance's owner can read it.
    env: dict[str, str] = field(default_factory=dict)
    onstart: str | None = None  # a shell command the provider runs at container start (Vast: onstart)
    bid_per_hour: float | None = None  # interruptible rentals: the bid for the whole node


@dataclass(frozen=True)
class Instance:
    """A rented instance as the provider describes it now."""

    provider: str
    instance_id: str
    state: InstanceState
    status: str  # the provider's own word for it, shown beside `state`
    label: InstanceLabel | None
    price_per_hour: float  # what it bills per hour for the whole node (0 once gone)
    gpus: int = 0
    gpu_name: str = ""
    ssh_host: str | None = None
    ssh_port: int | None = None
    ssh_user: str = "root"
    offer_id: str | None = None
    started_at: float | None = None  # epoch seconds the provider started billing, where it says

    def cost_so_far(self, now: float) -> float | None:
        """What it has billed until `now` at its current price; None where the provider gives no start."""
        if self.started_at is None:
            return None
        return self.price_per_hour * max(0.0, now - self.started_at) / 3600.0

    @property
    def reachable_endpoint(self) -> tuple[str, int] | None:
        """(host, port) for SSH once the provider runs it and published the port; None before."""
        if self.state is InstanceState.running and self.ssh_host and self.ssh_port:
            return self.ssh_host, self.ssh_port
        return None


class Provider(Protocol):
    """The handful of calls the sweep runner needs from a provider of rented nodes."""

    name: str

    def search(self, request: NodeRequest) -> list[Offer]:
        """Offers that may fit `request` (the provider's own filter; offers.choose_offers decides)."""
        ...

    def create(self, offer: Offer, spec: LaunchSpec) -> Instance:
        """Rent `offer` and start `spec` on it; returns at once (state usually pending). ProviderError when
        refused; when the provider accepted the rental but a later step failed, the error says which id."""
        ...

    def describe(self, instance_id: str) -> Instance:
        """The instance now; state `gone` when the provider no longer knows it."""
        ...

    def destroy(self, instance_id: str) -> None:
        """End the rental for good (no more billing); an instance already gone is no error."""
        ...

    def list_owned(self, controller_id: str) -> list[Instance]:
        """Every live instance labelled with `controller_id`, whatever sweep (the reaper's input)."""
        ...


@contextmanager
def sdk_errors(provider: str, operation: str, secret: str | None) -> Iterator[None]:
    """Re-raise whatever an SDK call raises as one ProviderError line, with `secret` scrubbed from the
    text and no exception chain (`from None`): a requests exception holds the prepared request and its
    Authorization header, which a traceback formatter or an error tracker could print."""
    try:
        yield
    except ProviderError:
        raise
    except Exception as exc:  # noqa: BLE001 - any SDK failure becomes one provider error
        text = f"{type(exc).__name__}: {exc}"
        if secret:
            text = text.replace(secret, "***")
        raise ProviderError(f"{provider}: {operation} failed: {text[:600]}") from None
