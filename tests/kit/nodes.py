"""A node row on the loopback OpenSSH server of tests/orchestrator/conftest.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.db.session import session_scope
from orchestrator.fleet.inventory import NodeCreate, add_node


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
        gpus=4,  # what the loopback server's stand-in nvidia-smi lists
    )
    with session_scope(database_url) as session:
        add_node(session, body)
    return name
