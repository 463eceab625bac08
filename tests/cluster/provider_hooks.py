"""What creating an instance of the provider simulator (tests/cluster/provider_sim.py) means besides recording
it: `ssh_banner_hooks` points instances at a loopback port that greets like sshd; in the namespace test bed
(`bed_hooks`) each instance is a real namespace node with its own sshd, removed on destroy."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

from tests.cluster.provider_sim import Hooks, SimInstance


class SshBanner:
    """A loopback TCP port that greets like sshd and closes: enough for "SSH answers" without root."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.sendall(b"SSH-2.0-provider-sim\r\n")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close()


def ssh_banner_hooks(banner: SshBanner) -> Hooks:
    return Hooks(on_create=lambda inst: ("127.0.0.1", banner.port))


def bed_hooks(bed: Any, gpus: Callable[[SimInstance], int] = lambda inst: inst.gpus, scoped: bool = True) -> Hooks:
    """Each created instance is a new node of the namespace test bed `bed` (tests/cluster/testbed.py):
    its own network namespace, IP, login user and sshd; an attached SSH key is authorized for its user,
    whose sessions see the instance's scoped key (`scoped`; False: a provider that gives none);
    preemption takes the node down (every process of its user, its Ray with them; sshd too); destroy
    removes the node."""

    def on_create(inst: SimInstance) -> tuple[str, int]:
        inst.handle = bed.add_node(gpus(inst))
        return inst.handle.ip, inst.handle.port

    def on_ssh_key(inst: SimInstance, key: str) -> None:
        bed.authorize(inst.handle, key, env=inst.scoped_env() if scoped else None)  # as the container env

    def on_destroy(inst: SimInstance) -> None:
        bed.remove_node(inst.handle)

    def on_preempt(inst: SimInstance) -> None:
        bed._stop(inst.handle)  # what a reclaimed machine does: everything on it stops at once

    return Hooks(on_create=on_create, on_ssh_key=on_ssh_key, on_destroy=on_destroy, on_preempt=on_preempt)
