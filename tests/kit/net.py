"""A port free on loopback (or another address of this machine) now."""

from __future__ import annotations

from orchestrator.cli import free_port as port_if_free


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, as the OS picks it (the CLI's own check). Nothing listens on it: a
    connection to it is refused at once."""
    port = port_if_free(host, 0)
    assert port is not None, f"binding port 0 on {host} failed"
    return port
