"""The tiniest arm overrides that still train (`tiny_overrides`; `QUICK`, the worker tests' arm), and the API
token of the test clients."""

from __future__ import annotations

from typing import Any

API_TOKEN = "test-token"  # the token of the test clients (tests/orchestrator/conftest.py `client`)
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}

# The worker tests' arm, tiny and quick: batch 4, 2 eval samples, 2 sampler steps; stand-ins chosen
# explicitly (offline).
QUICK: dict[str, Any] = {
    "model": {"size": "tiny"},
    "data": {"num_images": 64, "held_out": 4},
    "schedule": {"steps": 20, "batch_size": 4, "warmup_steps": 5, "checkpoint_every": 20, "ema": {"warmup_steps": 5}},
    "eval": {"num_samples": 2, "sampler_steps": 2, "lpips_backbone": "random_standin"},
    "repa": {"teacher": "random_standin"},
}


def tiny_overrides(
    steps: int, checkpoint_every: int = 10, *, batch_size: int = 4, num_images: int = 64, warmup_steps: int = 5
) -> dict[str, Any]:
    """Grid overrides for a tiny shapes run of `steps` steps with a checkpoint every `checkpoint_every`:
    seconds per arm on one CPU thread."""
    return {
        "model": {"size": "tiny", "depth": 3, "identity_tokens": 4},
        "data": {"dataset": "shapes", "num_images": num_images, "held_out": 2},
        "schedule": {
            "steps": steps,
            "batch_size": batch_size,
            "warmup_steps": warmup_steps,
            "checkpoint_every": checkpoint_every,
            "ema": {"warmup_steps": warmup_steps},
        },
        "eval": {"num_samples": 2, "sampler_steps": 2, "lpips_backbone": "random_standin"},
        "precision": {"mode": "fp32"},
    }


def bed_overrides(steps: int, checkpoint_every: int, warmup_steps: int = 2) -> dict[str, Any]:
    """`tiny_overrides` halved for the test bed's nodes (batches of 2 from 32 images), where several arms
    share one machine's cores."""
    return tiny_overrides(steps, checkpoint_every, batch_size=2, num_images=32, warmup_steps=warmup_steps)
