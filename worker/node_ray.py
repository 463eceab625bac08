"""A node's own Ray: the head that runs on the node itself, with a token that never leaves it.

Every node (the controller's own machine, a registered node, a rented instance) runs one Ray of its own,
never one cluster across machines: a rented host's owner has root, and anyone holding a Ray cluster's
token can run code on every member of it. The head listens on the node's loopback, its token is
generated on the node (0600, Ray's token auth: RAY_AUTH_MODE=token, the file RAY_AUTH_TOKEN_PATH
names), and it runs in its own process session: stopping it ends exactly that session, never with
`ray stop`, which ends every Ray of the machine (other users', a test's own).

Files in the node's Ray directory (`ablate/ray` under the login directory by default):
    token      the head's token (0600)
    address    host:port of the head, for the node agent
    session    the session id of the head's processes
"""

from __future__ import annotations

import ctypes
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

SESSION_FILE = "session"
TOKEN_FILE = "token"
ADDRESS_FILE = "address"
AGENTS_DIR = "agents"  # one file per live agent process (its pid): stopping the node's Ray ends them too


def ensure_token(path: Path) -> str:
    """The token in `path`, generated (256 bits, mode 0600 from the first byte) if missing."""
    if path.is_file():
        token = path.read_text().strip()
        if token:
            return token
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token)
    return token


def auth_env(token_file: Path | str) -> dict[str, str]:
    """Environment that turns Ray's token auth on with the token in `token_file`."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}


def session_pids(sid: int) -> list[int]:
    """Every live process whose session id is `sid` (Linux /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


def stop_session(sid: int, grace_s: float = 15.0) -> list[int]:
    """SIGTERM every process of session `sid`, SIGKILL what is left after `grace_s`; returns the pids."""
    seen: set[int] = set()
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        pids = session_pids(sid)
        seen.update(pids)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while session_pids(sid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not session_pids(sid):
            break
    return sorted(seen)


def start_session(directory: Path, command: list[str], env: dict[str, str] | None = None) -> int:
    """Run `command` (e.g. `ray start`, which leaves daemons behind) as the leader of a new session.

    The session id goes to directory/session before the command runs, so a failed start can still be
    stopped. Returns the command's exit status.
    """
    directory.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(command, start_new_session=True, env={**os.environ, **(env or {})})
    (directory / SESSION_FILE).write_text(str(proc.pid))  # a session leader's pid is its session id
    return proc.wait()


def register_agent(directory: Path) -> Path:
    """Note this process as an agent of the node's Ray (removed by the caller on exit)."""
    agents = directory / AGENTS_DIR
    agents.mkdir(parents=True, exist_ok=True)
    mark = agents / str(os.getpid())
    mark.write_text(" ".join(sys.argv))
    return mark


def _stop_agents(directory: Path) -> list[int]:
    """SIGTERM the agents noted in directory/agents that are still ours (the pid runs worker.agent)."""
    stopped = []
    for mark in sorted((directory / AGENTS_DIR).glob("*")) if (directory / AGENTS_DIR).is_dir() else []:
        pid = int(mark.name) if mark.name.isdigit() else 0
        try:
            if pid and b"worker.agent" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGTERM)
                stopped.append(pid)
        except (OSError, ProcessLookupError):
            pass
        mark.unlink(missing_ok=True)
    return stopped


def stop_session_dir(directory: Path, grace_s: float = 15.0) -> list[int]:
    """Stop the session recorded in directory/session (nothing if there is none) and the node's agents;
    forget them."""
    agents = _stop_agents(directory)
    path = directory / SESSION_FILE
    if not path.is_file():
        return agents
    pids = stop_session(int(path.read_text().strip()), grace_s)
    path.unlink()
    (directory / ADDRESS_FILE).unlink(missing_ok=True)
    return [*agents, *pids]


def head_running(directory: Path) -> bool:
    """The head recorded in `directory` is up: its session has processes and its port answers."""
    session, address = directory / SESSION_FILE, directory / ADDRESS_FILE
    if not (session.is_file() and address.is_file()):
        return False
    if not session_pids(int(session.read_text().strip())):
        return False
    host, _, port = address.read_text().strip().rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except OSError:
        return False
    return True


def end_with_parent(sig: int) -> Callable[[], None]:
    """A `preexec_fn`: the child gets `sig` when the thread that started it ends (Linux prctl
    PR_SET_PDEATHSIG), so a killed parent leaves no child behind, even one too busy to see its pipes close."""

    def arm() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(1, sig)

    return arm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_head(directory: Path, num_gpus: int | None, ray: str | None = None, grace_s: float = 15.0) -> str:
    """The node's Ray head on loopback, with a node-local token, in its own session; its address.

    Idempotent: a head already running from `directory` is kept. `num_gpus` None lets Ray detect them
    (a real GPU node); a number declares logical GPUs (the test bed, the CPU demo). The dashboard is off
    and the temp dir is `directory/tmp` (short: Ray's unix sockets live there).
    """
    directory = directory.resolve()
    if head_running(directory):
        return (directory / ADDRESS_FILE).read_text().strip()
    stop_session_dir(directory, grace_s)  # a half-dead earlier head
    token = directory / TOKEN_FILE
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    directory.chmod(0o700)
    ensure_token(token)
    ray = ray or str(Path(sys.executable).parent / "ray")
    port = _free_port()
    command = [
        ray, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--include-dashboard=false",
        f"--temp-dir={directory / 'tmp'}", "--disable-usage-stats",
    ]  # fmt: skip
    if num_gpus is not None:
        command.append(f"--num-gpus={num_gpus}")
    status = start_session(directory, command, env=auth_env(token))
    if status != 0:
        stop_session_dir(directory, grace_s)
        raise RuntimeError(f"`{' '.join(command)}` exited {status}")
    address = f"127.0.0.1:{port}"
    (directory / ADDRESS_FILE).write_text(address)
    return address
