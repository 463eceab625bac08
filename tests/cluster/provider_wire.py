"""What the providers' APIs speak, for the simulator (tests/cluster/provider_sim.py): offer and GPU rows as
Vast and RunPod send them, and Vast's filter language and RunPod's GraphQL text as far as the SDK calls go."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any


def vast_offer(offer_id: int, gpu_name: str = "RTX 4090", gpus: int = 4, dph_total: float = 1.6, **extra: Any) -> dict:
    """A Vast offer row with the fields the SDK's default filters and our provider read."""
    row = {
        "id": offer_id,
        "ask_contract_id": offer_id,
        "machine_id": 1000 + offer_id,
        "gpu_name": gpu_name,
        "num_gpus": gpus,
        "dph_total": dph_total,
        "min_bid": round(dph_total * 0.4, 4),
        "reliability": 0.99,
        "reliability2": 0.99,
        "cuda_max_good": 12.4,
        "disk_space": 500.0,
        "gpu_ram": 24564,
        "geolocation": "Sweden, SE",
        "verified": True,
        "external": False,
        "rentable": True,
        "rented": False,
    }
    row.update(extra)
    return row


def runpod_gpu(gpu_id: str = "NVIDIA GeForce RTX 4090", secure: float = 0.69, community: float = 0.34) -> dict:
    """A RunPod GPU type with per-GPU prices in both clouds."""
    return {
        "id": gpu_id,
        "displayName": gpu_id.replace("NVIDIA GeForce ", ""),
        "memoryInGb": 24,
        "maxGpuCount": 8,
        "manufacturer": "Nvidia",
        "cudaCores": 16384,
        "secureCloud": secure is not None,
        "communityCloud": community is not None,
        "securePrice": secure,
        "communityPrice": community,
        "oneMonthPrice": None,
        "threeMonthPrice": None,
        "oneWeekPrice": None,
        "communitySpotPrice": None,
        "secureSpotPrice": None,
    }


FILTER_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda a, b: a == b,
    "neq": lambda a, b: a != b,
    "gte": lambda a, b: a is not None and a >= b,
    "lte": lambda a, b: a is not None and a <= b,
    "gt": lambda a, b: a is not None and a > b,
    "lt": lambda a, b: a is not None and a < b,
    "in": lambda a, b: a in b,
    "notin": lambda a, b: a not in b,
}
NOT_FILTERS = {"order", "type", "limit", "allocated_storage", "disable_bundling"}


def offer_matches(offer: dict, q: dict[str, Any]) -> bool:
    for name, cond in q.items():
        if name in NOT_FILTERS or not isinstance(cond, dict):
            continue
        for op, want in cond.items():
            if op not in FILTER_OPS or not FILTER_OPS[op](offer.get(name), want):
                return False
    return True


def query_field(query: str, name: str) -> str | None:
    m = re.search(rf'\b{name}:\s*"([^"]*)"', query)
    return m[1] if m else None


def query_number(query: str, name: str) -> str | None:
    m = re.search(rf"\b{name}:\s*(\d+)", query)
    return m[1] if m else None


def query_enum(query: str, name: str) -> str | None:
    m = re.search(rf"\b{name}:\s*([A-Z_]+)", query)
    return m[1] if m else None


def lowest_price(gpu: dict) -> dict:
    prices = [p for p in (gpu["securePrice"], gpu["communityPrice"]) if p is not None]
    return {"minimumBidPrice": None, "uninterruptablePrice": min(prices) if prices else None}
