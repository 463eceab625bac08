"""The tiniest arm overrides that still train, checkpoint and evaluate: seconds per arm on one CPU thread.

Shared by the tests that run real workers (tests.orchestrator.tiny, as tests.cluster.testbed is imported).
"""

from __future__ import annotations

from typing import Any


def tiny_overrides(steps: int) -> dict[str, Any]:
    """Grid overrides for a tiny shapes run of `steps` steps with a checkpoint every 10."""
    return {
        "model": {"size": "tiny", "depth": 3, "identity_tokens": 4},
        "data": {"dataset": "shapes", "num_images": 64, "held_out": 2},
        "schedule": {
            "steps": steps,
            "batch_size": 4,
            "warmup_steps": 5,
            "checkpoint_every": 10,
            "ema": {"warmup_steps": 5},
        },
        "eval": {"num_samples": 2, "sampler_steps": 2, "lpips_backbone": "random_standin"},
        "precision": {"mode": "fp32"},
    }
