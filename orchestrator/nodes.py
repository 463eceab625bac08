"""Rented GPU nodes reached over SSH: register, probe, bootstrap into the Ray cluster, drain, tear down.

Security: paramiko with known host keys only. A host key that is not in the known-hosts file, or
one that differs from the recorded key, is refused with its SHA256 fingerprint and the command
that trusts it; nothing is ever added to a known-hosts file automatically.

Every remote command runs with a timeout, its exit status is checked, and its output is stored as
an Event (kind "node.command"); a step that fails stops its sequence with the command and output.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import re
import shlex
import stat
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Event, Node, Schedule, utcnow
from orchestrator.db.session import session_scope
from orchestrator.errors import Conflict, InvalidBody, NotFound
from orchestrator.vocabulary import NodeState

if TYPE_CHECKING:  # paramiko is imported where SSH happens: the API must start fast
    import paramiko

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"  # node and schedule names
Named = TypeVar("Named", Node, Schedule)
# Seconds of silence after which an SFTP read/write gives up, and between SSH keepalives.
SFTP_TIMEOUT_S = 120.0
KEEPALIVE_S = 30
OUTPUT_KEEP = 16_000  # characters of stdout/stderr kept per command event (the tail: errors come last)


class NodeError(RuntimeError):
    """A node operation that could not be done; the message is one line the user can act on."""


class NodeNotFound(NotFound, NodeError):
    """No node of that name."""


class NodeConflict(Conflict, NodeError):
    """The name is taken, or a schedule still uses the node."""


class NodeInvalid(InvalidBody, NodeError):
    """A node body whose key files are not where the controller allows them."""


class HostKeyError(NodeError):
    """The server's host key is unknown or changed: refused, with its fingerprint and how to trust it."""


class CommandFailed(NodeError):
    """A remote command exited non-zero or ran past its timeout."""

    def __init__(self, node: str, result: CommandResult) -> None:
        self.result = result
        what = f"timed out after {result.timeout_s:g} s" if result.timed_out else f"exited {result.exit_code}"
        output = (result.stderr.strip() or result.stdout.strip())[-800:]
        super().__init__(f"node {node!r}: `{result.command}` {what}: {output or '(no output)'}")


# -- registry ---------------------------------------------------------------------------------------


class NodeCreate(BaseModel):
    """A node as POST /api/nodes and `ablate nodes add` take it. Paths are on the controller machine."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, examples=["quad-4090-a"])
    host: str = Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9.:\[\]_-]+$", examples=["203.0.113.7"])
    port: int = Field(default=22, ge=1, le=65535)
    user: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._][A-Za-z0-9._-]*$", examples=["ubuntu"])
    key_path: str = Field(min_length=1, max_length=4096, examples=["~/.ssh/id_ed25519"])
    # None: the controller user's ~/.ssh/known_hosts.
    known_hosts_path: str | None = Field(default=None, min_length=1, max_length=4096)
    # What the provider charges per hour for the whole node; the sweep budget sums these.
    price_per_hour: float = Field(default=0.0, ge=0, le=1e6)

    @field_validator("key_path", "known_hosts_path")
    @classmethod
    def _usable_path(cls, v: str | None) -> str | None:
        # Only the syntax here: where the file may lie and whether it exists is `check_key_paths`, which
        # the API runs against the operator's allowed directories (no file-existence oracle elsewhere).
        if v is None:
            return v
        if "\x00" in v:
            raise ValueError("must not contain NUL characters")
        try:
            return str(Path(v).expanduser().resolve())
        except (OSError, RuntimeError) as exc:  # name too long, ~unknownuser, ...
            raise ValueError(f"not a usable file path: {exc}") from None


def key_path_problems(body: NodeCreate, allowed_dirs: Sequence[Path]) -> dict[str, str]:
    """Field -> what is wrong, for key_path / known_hosts_path: each must be an existing file under one
    of `allowed_dirs` (ABLATE_SSH_KEY_DIRS). A path outside them is refused without looking at it, so
    the answer tells a client nothing about files elsewhere on the controller."""
    roots = [d.expanduser().resolve() for d in allowed_dirs]
    problems: dict[str, str] = {}
    for name in ("key_path", "known_hosts_path"):
        value = getattr(body, name)
        if value is None:
            continue
        path = Path(value)  # already expanded and resolved (symbolic links followed) by the validator
        if not any(path.is_relative_to(root) for root in roots):
            where = ", ".join(map(str, roots)) or "(none configured)"
            problems[name] = f"must be a file under the allowed SSH key directories (ABLATE_SSH_KEY_DIRS): {where}"
        elif not path.is_file():
            problems[name] = f"no such file on the controller: {path}"
    return problems


def add_node(session: Session, body: NodeCreate, key_dirs: Sequence[Path] | None = None) -> Node:
    """Register a node; NodeConflict if the name is taken. With `key_dirs` (ABLATE_SSH_KEY_DIRS), its
    key files must lie under them (NodeInvalid naming the field otherwise). Flushes, no commit."""
    problems = key_path_problems(body, key_dirs) if key_dirs is not None else {}
    if problems:
        raise NodeInvalid([{"loc": [field], "msg": msg, "type": "value_error"} for field, msg in problems.items()])
    if find_node(session, body.name) is not None:
        raise NodeConflict(f"a node named {body.name!r} already exists; remove it first or pick another name")
    node = Node(**body.model_dump())
    session.add(node)
    session.flush()
    return node


def find_named(session: Session, model: type[Named], name: str) -> Named | None:
    """The node or schedule called `name`, or None."""
    if not re.match(NAME_PATTERN, name):
        return None  # cannot exist; also keeps NUL bytes and the like away from the database
    return session.scalar(select(model).where(model.name == name))  # type: ignore[attr-defined]


def find_node(session: Session, name: str) -> Node | None:
    return find_named(session, Node, name)


def get_node(session: Session, name: str) -> Node:
    node = find_node(session, name)
    if node is None:
        raise NodeNotFound(f"no node named {name!r}; `ablate nodes list` shows the registered ones")
    return node


def list_nodes(session: Session) -> list[Node]:
    return list(session.scalars(select(Node).order_by(Node.name)))


def remove_node(session: Session, name: str) -> None:
    """Forget a node; refused while a schedule still names it. The machine itself is not touched."""
    node = get_node(session, name)
    users = [s.name for s in session.scalars(select(Schedule)) if name in s.nodes]
    if users:
        raise NodeConflict(f"node {name!r} is used by schedule(s) {', '.join(users)}; change or delete those first")
    session.delete(node)
    session.flush()


@contextmanager
def remote_errors(name: str) -> Iterator[None]:
    """Anything that goes wrong on the way to the node, as a NodeError naming it (the API answers 424,
    the CLI prints one line): SSH and socket errors, and invalid ABLATE_NODE_* settings."""
    import paramiko
    from pydantic import ValidationError

    try:
        yield
    except NodeError:
        raise
    except ValidationError as exc:  # BootstrapConfig: the controller's ABLATE_NODE_* settings
        raise NodeError(f"node {name!r}: invalid ABLATE_NODE_ settings: {exc}") from None
    except (paramiko.SSHException, OSError, EOFError, ValueError) as exc:
        raise NodeError(f"node {name!r}: {type(exc).__name__}: {exc}") from None


# -- SSH ----------------------------------------------------------------------------------------------


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style SHA256 fingerprint, as `ssh-keygen -lf` prints it."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


def _host_entry(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def _trust_hint(host: str, port: int, known_hosts: str) -> str:
    return (
        f"check the fingerprint with the provider, then trust it: "
        f"`ssh-keyscan -p {port} {host} >> {known_hosts}` (and pass --known-hosts {known_hosts})"
    )


def _refuse_unknown_host(port: int, known_hosts: str) -> paramiko.MissingHostKeyPolicy:
    """RejectPolicy that says which key was offered and how to trust it, instead of a bare refusal."""
    import paramiko

    class RefuseUnknownHost(paramiko.RejectPolicy):
        def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
            host = hostname.removeprefix("[").split("]")[0]
            raise HostKeyError(
                f"unknown host key for {_host_entry(host, port)}: {key.get_name()} {fingerprint(key)} is not in "
                f"{known_hosts}; {_trust_hint(host, port, known_hosts)}"
            )

    return RefuseUnknownHost()


@dataclass
class CommandResult:
    command: str
    exit_code: int | None  # None: killed by the timeout
    stdout: str
    stderr: str
    duration_s: float
    timeout_s: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.exit_code == 0


@dataclass
class NodeShell:
    """An open SSH connection to one node that records every command it runs as an Event.

    Use as a context manager: `with NodeShell.open(node, database_url) as sh: sh.run("nvidia-smi")`.
    """

    name: str
    client: paramiko.SSHClient
    database_url: str | None = None
    node_id: int | None = None
    results: list[CommandResult] = field(default_factory=list)

    @classmethod
    def open(cls, node: Node, database_url: str | None = None, connect_timeout_s: float = 15.0) -> NodeShell:
        """Connect with known host keys only (RejectPolicy); HostKeyError or NodeError when refused."""
        known_hosts = node.known_hosts_path or str(Path("~/.ssh/known_hosts").expanduser())
        if not Path(known_hosts).is_file():
            raise HostKeyError(
                f"known-hosts file {known_hosts} does not exist, so no host key of {node.host} can be trusted; "
                + _trust_hint(node.host, node.port, known_hosts)
            )
        import paramiko

        client = paramiko.SSHClient()
        client.load_host_keys(known_hosts)
        client.set_missing_host_key_policy(_refuse_unknown_host(node.port, known_hosts))
        try:
            client.connect(
                node.host,
                port=node.port,
                username=node.user,
                key_filename=node.key_path,
                timeout=connect_timeout_s,
                banner_timeout=connect_timeout_s,
                auth_timeout=connect_timeout_s,
                allow_agent=False,
                look_for_keys=False,
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            entry = _host_entry(node.host, node.port)
            raise HostKeyError(
                f"host key of {entry} CHANGED: the server offered {exc.key.get_name()} {fingerprint(exc.key)} but "
                f"{known_hosts} records {fingerprint(exc.expected_key)}; this may be an attack or a re-imaged node. "
                f"If the provider confirms the new key: `ssh-keygen -R '{entry}' -f {known_hosts}` then "
                f"`ssh-keyscan -p {node.port} {node.host} >> {known_hosts}`"
            ) from None
        except HostKeyError:
            client.close()
            raise
        except (paramiko.SSHException, OSError, ValueError) as exc:  # ValueError: a file that is not a key
            client.close()
            raise NodeError(
                f"cannot connect to node {node.name!r} ({node.user}@{node.host}:{node.port}): {exc}"
            ) from None
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(KEEPALIVE_S)  # a silently dropped link fails instead of hanging
        return cls(name=node.name, client=client, database_url=database_url, node_id=node.id)

    def __enter__(self) -> NodeShell:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def run(self, command: str, timeout_s: float = 120.0, check: bool = True) -> CommandResult:
        """Run `command` through the remote login shell; wall-clock `timeout_s` seconds.

        The result is stored as a "node.command" event; CommandFailed when check and it did not exit 0.
        On timeout the channel is closed (sshd then hangs up on the remote process group).
        """
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise NodeError(f"node {self.name!r}: SSH connection lost before `{command}`")
        start = time.monotonic()
        channel = transport.open_session()
        channel.settimeout(1.0)
        channel.exec_command(command)
        out, err = bytearray(), bytearray()
        timed_out = False
        while True:
            while channel.recv_ready():
                out += channel.recv(65536)
            while channel.recv_stderr_ready():
                err += channel.recv_stderr(65536)
            if channel.exit_status_ready() and not channel.recv_ready() and not channel.recv_stderr_ready():
                break
            if time.monotonic() - start > timeout_s:
                timed_out = True
                break
            time.sleep(0.02)
        if not timed_out:
            # Output can trail the exit status; read on to the end of the stream.
            for recv, buf in ((channel.recv, out), (channel.recv_stderr, err)):
                try:
                    while chunk := recv(65536):
                        buf += chunk
                except TimeoutError:
                    pass
        exit_code = None if timed_out else channel.recv_exit_status()
        channel.close()
        result = CommandResult(
            command=command,
            exit_code=exit_code,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            duration_s=round(time.monotonic() - start, 3),
            timeout_s=timeout_s,
            timed_out=timed_out,
        )
        self.results.append(result)
        self._record(result)
        if check and not result.ok:
            raise CommandFailed(self.name, result)
        return result

    def _record(self, r: CommandResult) -> None:
        if self.database_url is None:
            return
        with session_scope(self.database_url) as session:
            session.add(
                Event(
                    node_id=self.node_id,
                    kind="node.command",
                    message=r.command[:2000],
                    data={
                        "node": self.name,
                        "exit_code": r.exit_code,
                        "timed_out": r.timed_out,
                        "duration_s": r.duration_s,
                        "timeout_s": r.timeout_s,
                        "stdout": r.stdout[-OUTPUT_KEEP:],
                        "stderr": r.stderr[-OUTPUT_KEEP:],
                    },
                )
            )

    def sftp(self) -> paramiko.SFTPClient:
        """An SFTP session whose reads and writes give up after SFTP_TIMEOUT_S of silence (a dead link
        would otherwise block the caller forever; the transport's keepalive notices it)."""
        sftp = self.client.open_sftp()
        sftp.get_channel().settimeout(SFTP_TIMEOUT_S)
        return sftp

    def put(self, local: Path, remote: str, mode: int | None = None) -> None:
        """Copy one file to the node over SFTP (remote relative paths are under the login directory).

        `mode`: set on the open file before any byte is written (for secrets such as the cluster token).
        """
        with self.sftp() as sftp:
            if mode is None:
                sftp.put(str(local), remote)
            else:
                with sftp.open(remote, "w") as fh:
                    fh.chmod(mode)
                    fh.write(local.read_bytes())
        self._note("sftp.put", f"{local} -> {remote}" + (f" (mode {mode:o})" if mode is not None else ""))

    def fetch_tree(self, remote: str, local: Path, skipped: list[str] | None = None) -> list[Path]:
        """Copy a remote file or directory tree to `local` over SFTP; returns the files written.

        The node is not trusted: nothing is written outside `local`. Names the server lists that are
        not a single plain path part (`..`, `.`, with a `/`, NUL, empty) are refused, and symbolic
        links are not followed (one to `/` would copy the node's filesystem); both are appended to
        `skipped` and named in the node event.
        """
        written: list[Path] = []
        links: list[str] = []
        refused: list[str] = []
        root = local.resolve()
        with self.client.open_sftp() as sftp:
            for rel, kind in _walk(sftp, remote, refused=refused):
                target = local.joinpath(*PurePosixPath(rel).parts) if rel else local
                if kind == "link":
                    links.append(str(PurePosixPath(remote) / rel) if rel else remote)
                    continue
                if not target.resolve().is_relative_to(root):  # e.g. a local link planted earlier
                    refused.append(f"{PurePosixPath(remote) / rel} (would land outside {local})")
                    continue
                if kind == "dir":
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                sftp.get(str(PurePosixPath(remote) / rel) if rel else remote, str(target))
                written.append(target)
        if skipped is not None:
            skipped.extend(links + refused)
        note = f"; skipped {len(links)} symbolic links: {', '.join(links)}" if links else ""
        note += f"; refused {len(refused)} unsafe names: {', '.join(refused)}" if refused else ""
        self._note("sftp.get", f"{remote} -> {local} ({len(written)} files{note})")
        return written

    def _note(self, kind: str, message: str) -> None:
        if self.database_url is None:
            return
        with session_scope(self.database_url) as session:
            session.add(Event(node_id=self.node_id, kind=f"node.{kind}", message=message, data={"node": self.name}))


def _safe_name(name: str) -> bool:
    """One plain path part: what a directory listing may hold (a hostile server may send anything)."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and "\x00" not in name


def _walk(
    sftp: paramiko.SFTPClient, root: str, rel: str = "", refused: list[str] | None = None
) -> Iterator[tuple[str, str]]:
    """(relative path, "dir" | "file" | "link") under root, depth first; links are not followed and
    unsafe names are appended to `refused` instead of being walked."""
    path = str(PurePosixPath(root) / rel) if rel else root
    try:
        attrs = sftp.lstat(path)
    except FileNotFoundError:
        raise NodeError(f"remote path {path} does not exist") from None
    mode = attrs.st_mode or 0
    if stat.S_ISLNK(mode):
        yield rel, "link"
    elif stat.S_ISDIR(mode):
        yield rel, "dir"
        for entry in sorted(sftp.listdir_attr(path), key=lambda a: a.filename):
            if not _safe_name(entry.filename):
                if refused is not None:
                    refused.append(f"{path}/{entry.filename!r} (unsafe name)")
                continue
            child = str(PurePosixPath(rel) / entry.filename) if rel else entry.filename
            yield from _walk(sftp, root, child, refused)
    else:
        yield rel, "file"


# -- probe ----------------------------------------------------------------------------------------------

GPU_QUERY = "nvidia-smi --query-gpu=index,name,memory.total,driver_version,uuid --format=csv,noheader,nounits"


def parse_gpus(text: str) -> list[dict[str, Any]]:
    """nvidia-smi CSV (index, name, memory MiB, driver, uuid) -> one dict per GPU; memory in MiB."""
    gpus = []
    for row in csv.reader(line for line in text.splitlines() if line.strip()):
        if len(row) != 5:
            raise NodeError(f"unexpected nvidia-smi line {','.join(row)!r}; expected index,name,memory,driver,uuid")
        index, name, memory, driver, uuid = (c.strip() for c in row)
        gpus.append(
            {"index": int(index), "name": name, "memory_mib": int(float(memory)), "driver": driver, "uuid": uuid}
        )
    return gpus


def probe(shell: NodeShell, timeout_s: float = 60.0) -> dict[str, Any]:
    """GPUs (from nvidia-smi), free disk of the login directory (GB) and the remote python3 version."""
    gpus = parse_gpus(shell.run(GPU_QUERY, timeout_s).stdout)
    df = shell.run("df -Pk .", timeout_s).stdout.splitlines()
    try:
        free_kib = int(df[-1].split()[3])
    except (IndexError, ValueError):
        raise NodeError(f"node {shell.name!r}: cannot read free disk from `df -Pk .`: {df!r}") from None
    python = shell.run("python3 -c 'import platform; print(platform.python_version())'", timeout_s).stdout.strip()
    hostname = shell.run("hostname", timeout_s).stdout.strip()
    return {
        "node": shell.name,
        "hostname": hostname,
        "gpus": gpus,
        "free_disk_gb": round(free_kib * 1024 / 1e9, 2),
        "python": python,
    }


def probe_node(database_url: str, name: str) -> dict[str, Any]:
    """Probe a registered node and store the result on it (state "ready"); returns the probe JSON."""
    with session_scope(database_url) as session:
        node = get_node(session, name)
        session.expunge(node)
    with NodeShell.open(node, database_url) as shell:
        result = probe(shell)
    result["probed_at"] = utcnow().isoformat()
    with session_scope(database_url) as session:
        row = get_node(session, name)
        row.gpus = result["gpus"]
        row.last_probe = result
        if row.state == NodeState.registered:
            row.state = NodeState.ready
    return result


# -- bootstrap / drain / teardown ------------------------------------------------------------------------


class BootstrapConfig(BaseSettings):
    """How a node becomes a Ray worker. Environment: ABLATE_NODE_<FIELD> (lists as JSON arrays).

    Each command is a template with {python}, {remote_dir}, {venv}, {package}, {ray_address},
    {num_gpus}, {token_path}, {env}, {join_args}, {find_links}; commands run in order and the first
    failure stops the sequence.
    """

    model_config = SettingsConfigDict(env_prefix="ABLATE_NODE_", extra="ignore", env_ignore_empty=True)

    # The controller's Ray head as workers reach it (host:6379). Required for bootstrap.
    ray_address: str | None = None
    # The cluster token on the controller (`ablate ray-head` writes storage_dir/ray_token). Copied to
    # the node as {remote_dir}/ray_token, mode 0600 in a 0700 directory; Ray reads it from the file
    # RAY_AUTH_TOKEN_PATH names, so the token is never on a command line.
    token_file: Path | None = None
    # A wheel or sdist of this project built on the controller (`pip wheel --no-deps .`), copied over SFTP.
    package: Path | None = None
    # A local wheelhouse on the controller (`pip wheel -w wheelhouse '.[gpu]'`), copied over SFTP: the
    # install then never needs a package index (--no-index --find-links). None: install from the index.
    wheelhouse: Path | None = None
    # Working directory on the node; relative paths are under the login directory (SFTP and shell agree).
    remote_dir: str = "ablate"
    # A Python environment already on the node (a worker image's); None: {remote_dir}/venv, made by install.
    venv: str | None = None
    python: str = "python3"
    # Ray needs the same Python major.minor on every node of a cluster: checked before installing.
    match_python: bool = True
    install: list[str] = [
        "{python} -m venv {venv}",
        "{venv}/bin/pip install {find_links} --upgrade pip",
        "{venv}/bin/pip install {find_links} {package}",
    ]
    # The node's Ray runs in its own process session (recorded in {remote_dir}/ray/session) and temp dir.
    join: list[str] = [
        "{env} RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={token_path} {venv}/bin/python -m orchestrator.cluster "
        'start-session {remote_dir}/ray -- {venv}/bin/ray start --address={ray_address} --num-gpus={num_gpus} '
        '--temp-dir="$HOME"/{remote_dir}/ray-tmp --disable-usage-stats {join_args}'
    ]
    # Extra `ray start` arguments (e.g. --num-cpus=4) and environment (NAME: value) of the join command.
    join_args: str = ""
    env: dict[str, str] = {}
    # Leaving the cluster stops exactly the node's Ray session: never `ray stop`, which ends every
    # Ray process of the machine.
    leave: list[str] = ["{env} {venv}/bin/python -m orchestrator.cluster stop-session {remote_dir}/ray"]
    # After leave, on teardown. Checkpoints are copied back before this runs.
    cleanup: list[str] = ["rm -rf {remote_dir}"]
    # Seconds per command; pip installing torch on a fresh node takes minutes.
    command_timeout_s: float = Field(default=1800.0, gt=0)

    @field_validator("remote_dir")
    @classmethod
    def _safe_remote_dir(cls, v: str) -> str:
        # cleanup runs `rm -rf` on it: only a dedicated directory below the login directory, compared
        # after normalising (so `ablate/..`, `./`, `~/.` are the home directory they name).
        path = PurePosixPath(v.strip())
        parts = [p for p in path.parts if p != "."]
        if path.is_absolute() or ".." in parts or not parts or parts[0].startswith(("~", "$")):
            raise ValueError(
                f"{v!r} must be a dedicated directory relative to the login directory, such as 'ablate', "
                "without '..', '~', '$' or a leading '/' (teardown deletes it)"
            )
        return str(PurePosixPath(*parts))

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
        if bad:
            raise ValueError(f"not environment variable names: {', '.join(map(repr, bad))}")
        return v

    def variables(self, num_gpus: int, package: str = "") -> dict[str, str]:
        venv = self.venv or f"{self.remote_dir}/venv"
        wheels = f"{self.remote_dir}/wheelhouse"
        return {
            "python": shlex.quote(self.python),
            "remote_dir": shlex.quote(self.remote_dir),
            "venv": shlex.quote(venv),
            "package": shlex.quote(package) if package else "",
            "ray_address": shlex.quote(self.ray_address or ""),
            "num_gpus": str(num_gpus),
            "token_path": '"$HOME"/' + shlex.quote(f"{self.remote_dir}/ray_token"),
            "env": " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items()),
            "join_args": self.join_args,
            "find_links": f"--no-index --find-links {shlex.quote(wheels)}" if self.wheelhouse else "",
        }


def run_steps(shell: NodeShell, templates: Sequence[str], variables: dict[str, str], timeout_s: float) -> None:
    """Run each command template in order; the first failure raises CommandFailed and stops the rest."""
    for template in templates:
        try:
            command = template.format(**variables)
        except (KeyError, IndexError) as exc:
            raise NodeError(f"command template {template!r} uses unknown placeholder {exc}") from None
        shell.run(command, timeout_s)


def bootstrap(shell: NodeShell, config: BootstrapConfig, num_gpus: int) -> None:
    """Install the worker environment on the node and join the controller's Ray cluster."""
    joining = "\n".join(config.join)
    if not config.ray_address and "{ray_address}" in joining:
        raise NodeError("ABLATE_NODE_RAY_ADDRESS is not set: the Ray head address (host:6379) nodes must join")
    if "{token_path}" in joining and (config.token_file is None or not config.token_file.is_file()):
        raise NodeError(
            f"ABLATE_NODE_TOKEN_FILE {config.token_file or '(unset)'} is not a file: the Ray cluster token "
            "(`ablate ray-head` writes it to the storage dir as ray_token)"
        )
    needs_package = any("{package}" in t for t in config.install)
    if needs_package and config.package is None:
        raise NodeError("ABLATE_NODE_PACKAGE is not set: build one with `pip wheel --no-deps -w dist .`")
    if config.match_python:
        query = f"{shlex.quote(config.python)} -c 'import sys; print(*sys.version_info[:2])'"
        version = shell.run(query, 60).stdout.split()
        local = [str(v) for v in sys.version_info[:2]]
        if version != local:
            raise NodeError(
                f"node {shell.name!r}: {config.python} is Python {'.'.join(version)} but the controller runs "
                f"{'.'.join(local)}; Ray needs the same Python minor version on every node: set "
                f"ABLATE_NODE_PYTHON to a python{'.'.join(local)} on the node (or ABLATE_NODE_MATCH_PYTHON=false)"
            )
    # 0700 before anything goes in: the token must never be readable by other users of the node.
    shell.run(f"mkdir -p {shlex.quote(config.remote_dir)} && chmod 700 {shlex.quote(config.remote_dir)}", 60)
    if config.token_file is not None and "{token_path}" in joining:
        shell.put(config.token_file, f"{config.remote_dir}/ray_token", mode=0o600)
    remote_package = ""
    if config.package is not None:
        if not config.package.is_file():
            raise NodeError(f"ABLATE_NODE_PACKAGE {config.package} does not exist on the controller")
        remote_package = f"{config.remote_dir}/{config.package.name}"
        shell.put(config.package, remote_package)
    if config.wheelhouse is not None:
        wheels = sorted(config.wheelhouse.glob("*.whl")) if config.wheelhouse.is_dir() else []
        if not wheels:
            raise NodeError(f"ABLATE_NODE_WHEELHOUSE {config.wheelhouse} holds no wheels (`pip wheel -w DIR ...`)")
        shell.run(f"mkdir -p {shlex.quote(config.remote_dir)}/wheelhouse", 60)
        for wheel in wheels:
            shell.put(wheel, f"{config.remote_dir}/wheelhouse/{wheel.name}")
    variables = config.variables(num_gpus, remote_package)
    run_steps(shell, config.install, variables, config.command_timeout_s)
    run_steps(shell, config.join, variables, config.command_timeout_s)


def drain(shell: NodeShell, config: BootstrapConfig) -> None:
    """Leave the Ray cluster; the node keeps its environment (running arms are re-queued elsewhere)."""
    run_steps(shell, config.leave, config.variables(0), config.command_timeout_s)


def teardown(shell: NodeShell, config: BootstrapConfig) -> None:
    """Leave the cluster and delete the working directory (copy checkpoints back first)."""
    drain(shell, config)
    run_steps(shell, config.cleanup, config.variables(0), config.command_timeout_s)


def _set_state(database_url: str, name: str, state: NodeState) -> None:
    with session_scope(database_url) as session:
        get_node(session, name).state = state


def _with_node(database_url: str, name: str) -> Node:
    with session_scope(database_url) as session:
        node = get_node(session, name)
        session.expunge(node)
    return node


def bootstrap_node(database_url: str, name: str, config: BootstrapConfig | None = None) -> dict[str, Any]:
    """Probe, then bootstrap a registered node (state "joined"); returns the probe JSON."""
    config = config or BootstrapConfig()
    node = _with_node(database_url, name)
    with NodeShell.open(node, database_url) as shell:
        found = probe(shell)
        if not found["gpus"]:
            raise NodeError(f"node {name!r}: nvidia-smi lists no GPUs")
        bootstrap(shell, config, num_gpus=len(found["gpus"]))
    with session_scope(database_url) as session:
        row = get_node(session, name)
        row.gpus, row.last_probe, row.state = found["gpus"], found, NodeState.joined
    return found


def drain_node(database_url: str, name: str, config: BootstrapConfig | None = None) -> None:
    config = config or BootstrapConfig()
    with NodeShell.open(_with_node(database_url, name), database_url) as shell:
        drain(shell, config)
    _set_state(database_url, name, NodeState.drained)


def teardown_node(database_url: str, name: str, config: BootstrapConfig | None = None) -> None:
    config = config or BootstrapConfig()
    with NodeShell.open(_with_node(database_url, name), database_url) as shell:
        teardown(shell, config)
    _set_state(database_url, name, NodeState.registered)
