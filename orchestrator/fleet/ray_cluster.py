"""The authenticated Ray cluster: the head the controller runs, and the session a node's Ray lives in.

Every Ray the project starts has token auth on (Ray 2.60: RAY_AUTH_MODE=token, the token read from
the file RAY_AUTH_TOKEN_PATH names); the token never appears on a command line. A Ray started here
runs in its own process session, and leaving stops exactly the processes of that session, never
with `ray stop`, which ends every Ray of the machine (other users', a test's own).

Also a small CLI that nodes run from their install (`python -m orchestrator.fleet.ray_cluster`):
    start-session DIR -- ray start ...   run the command in a new session; DIR/session holds its id
    stop-session DIR                      end every process of that session (TERM, then KILL)
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SESSION_FILE = "session"


def ensure_token(path: Path) -> str:
    """The cluster token in `path`, generated (256 bits, mode 0600 from the first byte) if missing."""
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


def stop_session_dir(directory: Path, grace_s: float = 15.0) -> list[int]:
    """Stop the session recorded in directory/session (nothing if there is none); forget it."""
    path = directory / SESSION_FILE
    if not path.is_file():
        return []
    pids = stop_session(int(path.read_text().strip()), grace_s)
    path.unlink()
    return pids


@dataclass
class RayHead:
    """A Ray head started by `start_head`; `stop()` ends exactly its session."""

    address: str  # host:port that nodes join
    session_dir: Path
    token_file: Path

    def stop(self, grace_s: float = 15.0) -> list[int]:
        return stop_session_dir(self.session_dir, grace_s)


def start_head(
    node_ip: str,
    port: int,
    token_file: Path,
    temp_dir: Path,
    dashboard_host: str = "127.0.0.1",
    num_cpus: int | None = None,
    ray: str | None = None,
    dashboard_port: int | None = None,
) -> RayHead:
    """`ray start --head` with token auth, no GPUs (nodes bring them), dashboard and job API on
    `dashboard_host` (loopback unless the operator opens it), in its own session."""
    ensure_token(token_file)
    ray = ray or str(Path(sys.executable).parent / "ray")
    command = [
        ray, "start", "--head", f"--node-ip-address={node_ip}", f"--port={port}", "--num-gpus=0",
        f"--dashboard-host={dashboard_host}", f"--temp-dir={temp_dir}", "--disable-usage-stats",
    ]  # fmt: skip
    if num_cpus is not None:
        command.append(f"--num-cpus={num_cpus}")
    if dashboard_port is not None:
        command.append(f"--dashboard-port={dashboard_port}")
    session_dir = temp_dir / "ablate-head"
    head = RayHead(address=f"{node_ip}:{port}", session_dir=session_dir, token_file=token_file)
    status = start_session(session_dir, command, env=auth_env(token_file))
    if status != 0:
        head.stop()
        raise RuntimeError(f"`{' '.join(command)}` exited {status}")
    return head


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.fleet.ray_cluster", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="action", required=True)
    start = sub.add_parser("start-session", help="run a command (after --) in a new session recorded in DIR")
    start.add_argument("dir", type=Path)
    start.add_argument("command", nargs=argparse.REMAINDER)
    stop = sub.add_parser("stop-session", help="end every process of the session recorded in DIR")
    stop.add_argument("dir", type=Path)
    stop.add_argument("--grace", type=float, default=15.0, help="seconds between SIGTERM and SIGKILL")
    args = parser.parse_args(argv)
    if args.action == "start-session":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            parser.error("start-session needs a command after --")
        return start_session(args.dir, command)
    pids = stop_session_dir(args.dir, args.grace)
    print(f"stopped {len(pids)} processes of the recorded Ray session")
    return 0


if __name__ == "__main__":
    sys.exit(main())
