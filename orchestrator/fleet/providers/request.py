"""A schedule's request for rented nodes, and the pure choice of offers that fit it.

`NodeRequest` is what a schedule says instead of naming nodes ("two 4x RTX 4090 nodes from Vast, at
most 0.45 per GPU-hour"); every field is validated and a field that the chosen provider cannot honour
is refused naming that field, never ignored. `choose_offers` is a pure function: the cheapest fitting
offers first, or NoFittingOffer saying why the rest did not fit.
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from orchestrator.fleet.providers.base import NoFittingOffer, Offer

ProviderName = Literal["static", "vast", "runpod"]
PROVIDERS: tuple[str, ...] = ("static", "vast", "runpod")


class NodeRequest(BaseModel):
    """What to rent for one sweep. Prices are per GPU-hour so that a cap reads the same for 1 or 8 GPUs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: ProviderName
    # The GPU model as the provider names it: Vast "RTX_4090" (underscores or spaces), RunPod's GPU type
    # id "NVIDIA GeForce RTX 4090". Matched case-insensitively with "_" and " " alike.
    gpu: Annotated[str, Field(min_length=2, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9 _.-]*$")]
    # One arm per GPU: the study's node was a quad.
    gpus_per_node: Annotated[int, Field(ge=1, le=16)] = 4
    nodes: Annotated[int, Field(ge=1, le=32)] = 1
    # The cap the researcher writes ("at most 0.45 per GPU-hour"); the node's price is gpus x this at most.
    max_price_per_gpu_hour: Annotated[float, Field(gt=0, le=100)]
    # Vast's host reliability score (0..1). None: no floor. Only Vast publishes one.
    min_reliability: Annotated[float, Field(ge=0, le=1)] | None = None
    # Container disk in GB: the image, the prepared data shards and the checkpoints of four arms.
    disk_gb: Annotated[int, Field(ge=10, le=8192)] = 100
    # Lowest CUDA version the host driver must support ("12.4"); None: any.
    cuda: Annotated[str, Field(pattern=r"^\d{1,2}\.\d$")] | None = None
    # Interruptible (Vast bid) instances are cheaper and can be preempted: arms resume from checkpoints.
    interruptible: bool = False

    @field_validator("min_reliability")
    @classmethod
    def _reliability_is_vast_only(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is not None and info.data.get("provider") != "vast":
            provider = info.data.get("provider")
            raise ValueError(f"only Vast.ai publishes a reliability score; leave it unset for {provider}")
        return v

    @field_validator("interruptible")
    @classmethod
    def _interruptible_supported(cls, v: bool, info: ValidationInfo) -> bool:
        provider = info.data.get("provider")
        if v and provider == "runpod":
            # runpod.create_pod deploys on-demand pods only (podFindAndDeployOnDemand); no spot call.
            raise ValueError("the runpod SDK rents on-demand pods only; set interruptible: false")
        if v and provider == "static":
            raise ValueError("registered static nodes are not interruptible; set interruptible: false")
        return v

    @property
    def max_price_per_node_hour(self) -> float:
        return self.max_price_per_gpu_hour * self.gpus_per_node


def gpu_key(name: str) -> str:
    """A GPU name compared loosely: "RTX_4090", "rtx 4090" and "RTX 4090" are one model."""
    return " ".join(name.replace("_", " ").lower().split())


def misfit(offer: Offer, request: NodeRequest) -> str | None:
    """Why `offer` does not fit `request` (a short reason, the key of the summary), or None if it fits."""
    if offer.provider != request.provider:
        return "another provider"
    # nvidia-smi's "NVIDIA GeForce RTX 4090" (static nodes) is the request's "RTX_4090" too.
    offered, wanted = gpu_key(offer.gpu_name), gpu_key(request.gpu)
    if offered != wanted and not offered.endswith(" " + wanted):
        return "another GPU model"
    if offer.gpus != request.gpus_per_node:
        return f"not {request.gpus_per_node} GPUs"
    if offer.price_per_gpu_hour > request.max_price_per_gpu_hour:
        return "over the price cap"
    if request.min_reliability is not None and (offer.reliability or 0.0) < request.min_reliability:
        return "below the reliability floor"
    if request.cuda is not None and (offer.cuda is None or offer.cuda < float(request.cuda)):
        return "CUDA too old"
    if offer.disk_gb is not None and offer.disk_gb < request.disk_gb:
        return "too little disk"
    if offer.interruptible != request.interruptible:
        return "interruptible" if offer.interruptible else "not interruptible"
    return None


def choose_offers(offers: list[Offer], request: NodeRequest) -> list[Offer]:
    """The fitting offers, cheapest per GPU-hour first (then more reliable, then by id, so the choice is
    reproducible), each repeated as many times as it can become nodes (a RunPod GPU type: `request.nodes`
    times). The runner rents the first `request.nodes` and falls back on the rest when a rental fails.
    NoFittingOffer when fewer than `request.nodes` fit."""
    fitting: list[Offer] = []
    reasons: Counter[str] = Counter()
    for offer in offers:
        reason = misfit(offer, request)
        if reason is None:
            fitting.append(offer)
        else:
            reasons[reason] += 1
    fitting.sort(key=lambda o: (o.price_per_gpu_hour, -(o.reliability or 0.0), o.offer_id))
    ranked = [o for o in fitting for _ in range(o.capacity if o.capacity is not None else request.nodes)]
    if len(ranked) < request.nodes:
        why = ", ".join(f"{n} {reason}" for reason, n in reasons.most_common()) or "none offered"
        cheapest = min((o.price_per_gpu_hour for o in offers), default=None)
        seen = f"; cheapest seen {cheapest:.3f}/GPU-h" if cheapest is not None else ""
        raise NoFittingOffer(
            f"{request.provider}: {len(ranked)} of {request.nodes} {request.gpus_per_node}x {request.gpu} nodes "
            f"at <= {request.max_price_per_gpu_hour}/GPU-h found among {len(offers)} offers ({why}{seen}); "
            "raise max_price_per_gpu_hour, lower min_reliability or ask fewer nodes"
        )
    return ranked
