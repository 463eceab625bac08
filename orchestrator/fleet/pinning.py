"""Host keys of freshly rented machines: pinned at first contact, to that one instance.

A rented instance's host key is unknown in advance (Vast and RunPod generate it when the container
starts and publish no fingerprint through their APIs), so `NodeShell`'s rule "known host keys only"
has nothing to check against. The controller therefore takes the key the instance offers at its first
SSH contact, writes it into a known-hosts file of its own for that instance only, and from then on
every connection to the instance must present exactly that key (a changed key is refused as always).
The remaining threat (docs/operations.md): whoever answers at the instance's address at first contact
is trusted; a later impostor is not.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from orchestrator.fleet.errors import NodeError
from orchestrator.fleet.shell import fingerprint


@dataclass(frozen=True)
class PinnedKey:
    path: Path  # the instance's own known-hosts file
    key_type: str  # ssh-ed25519, ...
    fingerprint: str  # SHA256:..., as `ssh-keygen -lf` prints it


def host_entry(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def pin_first_contact(host: str, port: int, known_hosts: Path, timeout_s: float = 15.0) -> PinnedKey:
    """Ask (host, port) for its host key (an SSH key exchange, no login) and write it as the only entry
    of `known_hosts` (mode 0600, replacing the file). NodeError when the server does not complete a key
    exchange."""
    import paramiko

    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            transport = paramiko.Transport(sock)
            try:
                transport.start_client(timeout=timeout_s)
                key = transport.get_remote_server_key()
            finally:
                transport.close()
    except (OSError, paramiko.SSHException, EOFError) as exc:
        raise NodeError(f"no host key from {host_entry(host, port)}: {type(exc).__name__}: {exc}") from None
    known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = known_hosts.with_suffix(".tmp")
    tmp.write_text(f"{host_entry(host, port)} {key.get_name()} {key.get_base64()}\n")
    tmp.chmod(0o600)
    tmp.replace(known_hosts)  # whole: a reader never sees half a line
    return PinnedKey(known_hosts, key.get_name(), fingerprint(key))
