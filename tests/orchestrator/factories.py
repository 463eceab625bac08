"""Small factories shared by the orchestrator tests (imported as tests.orchestrator.factories, the way
tests.cluster.testbed is): the tiniest arm overrides that still train, and a node on the loopback sshd.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from orchestrator.cli import free_port as port_if_free
from orchestrator.db.session import session_scope
from orchestrator.fleet.inventory import NodeCreate, add_node

API_TOKEN = "test-token"  # the token of the test clients of tests/orchestrator/runs/conftest.py
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}


def tiny_overrides(steps: int) -> dict[str, Any]:
    """Grid overrides for a tiny shapes run of `steps` steps with a checkpoint every 10: seconds per arm
    on one CPU thread."""
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


def add_ssh_node(
    database_url: str,
    sshd: Any,  # noqa: ANN401 - tests.orchestrator.conftest.SshServer
    name: str,
    price_per_hour: float = 2.0,
    known_hosts: Path | None = None,
) -> str:
    """Register a node on the loopback OpenSSH server (its known-hosts file unless `known_hosts`); returns its name."""
    body = NodeCreate(
        name=name,
        host=sshd.host,
        port=sshd.port,
        user=sshd.user,
        key_path=str(sshd.client_key),
        known_hosts_path=str(known_hosts or sshd.known_hosts),
        price_per_hour=price_per_hour,
    )
    with session_scope(database_url) as session:
        add_node(session, body)
    return name


class FakeClock:
    """A sweep runner's clock, moved by the test."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def free_port() -> int:
    """A port free on loopback now, as the OS picks it (the CLI's own check)."""
    port = port_if_free("127.0.0.1", 0)
    assert port is not None, "binding port 0 on loopback failed"
    return port
