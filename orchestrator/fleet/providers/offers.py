"""The offer choice: which offers fit a NodeRequest, cheapest first, and why the others do not.

Pure functions over frozen records (no provider call, no clock), so `ablate offers` shows exactly the
choice a sweep makes at fire: `choose_offers` ranks the fitting ones, or raises NoFittingOffer counting
why the rest did not fit; `misfit` is that reason for one offer.
"""

from __future__ import annotations

from collections import Counter

from orchestrator.fleet.providers.base import NoFittingOffer, Offer
from orchestrator.fleet.providers.request import NodeRequest


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
