"""An SSH connection to one node that records every command it runs.

Security: paramiko with known host keys only. A host key that is not in the known-hosts file, or
one that differs from the recorded key, is refused with its SHA256 fingerprint and the command
that trusts it; nothing is ever added to a known-hosts file automatically.

Every remote command runs with a timeout, its exit status is checked, and its output is stored as
an Event (kind "node.command"); a step that fails stops its sequence with the command and output.
"""

from __future__ import annotations

import base64
import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.db.models import Event, Node
from orchestrator.db.session import session_scope
from orchestrator.fleet.errors import HostKeyError, NodeError

if TYPE_CHECKING:  # paramiko is imported where SSH happens: the API must start fast
    import paramiko

# Seconds of silence after which an SFTP read/write gives up, and between SSH keepalives.
SFTP_TIMEOUT_S = 120.0
KEEPALIVE_S = 30
OUTPUT_KEEP = 16_000  # characters of stdout/stderr kept per command event (the tail: errors come last)
# Bytes of stdout and of stderr held per command while it runs: the node decides how much it prints, so only
# the tail is held (errors come last); what any caller parses (probe's few lines) is far smaller.
OUTPUT_MAX_BYTES = 1 << 20


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


def _connect_reason(exc: BaseException) -> str:
    """Why a connect failed, in the words of each address tried: paramiko's NoValidConnectionsError says
    only "Unable to connect to port" and keeps the reasons (refused, timed out, no route) aside."""
    import paramiko

    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) and exc.errors:
        return "; ".join(f"{addr[0]} port {addr[1]}: {err.strerror or err}" for addr, err in exc.errors.items())
    return str(exc) or type(exc).__name__


@dataclass
class CommandResult:
    command: str
    exit_code: int | None  # None: killed by the timeout
    stdout: str
    stderr: str
    duration_s: float
    timeout_s: float
    timed_out: bool = False
    dropped_bytes: int = 0  # output past OUTPUT_MAX_BYTES per stream, dropped from the front

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.exit_code == 0


class CommandFailed(NodeError):
    """A remote command exited non-zero or ran past its timeout."""

    def __init__(self, node: str, result: CommandResult) -> None:
        self.result = result
        what = f"timed out after {result.timeout_s:g} s" if result.timed_out else f"exited {result.exit_code}"
        output = (result.stderr.strip() or result.stdout.strip())[-800:]
        super().__init__(f"node {node!r}: `{result.command}` {what}: {output or '(no output)'}")


class _Tail:
    """The last OUTPUT_MAX_BYTES of a stream, and how many bytes before them were dropped."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        self.buf += chunk
        if len(self.buf) > 2 * OUTPUT_MAX_BYTES:  # trimmed in halves: amortized linear, whatever is printed
            cut = len(self.buf) - OUTPUT_MAX_BYTES
            del self.buf[:cut]
            self.dropped += cut

    def text(self) -> str:
        extra = len(self.buf) - OUTPUT_MAX_BYTES
        if extra > 0:
            del self.buf[:extra]
            self.dropped += extra
        return self.buf.decode(errors="replace")


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
                f"cannot connect to node {node.name!r} ({node.user}@{node.host}:{node.port}): {_connect_reason(exc)}"
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
        out, err = _Tail(), _Tail()
        timed_out = False
        while True:
            while channel.recv_ready():
                out.add(channel.recv(65536))
            while channel.recv_stderr_ready():
                err.add(channel.recv_stderr(65536))
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
                        buf.add(chunk)
                except TimeoutError:
                    pass
        exit_code = None if timed_out else channel.recv_exit_status()
        channel.close()
        result = CommandResult(
            command=command,
            exit_code=exit_code,
            stdout=out.text(),
            stderr=err.text(),
            duration_s=round(time.monotonic() - start, 3),
            timeout_s=timeout_s,
            timed_out=timed_out,
            dropped_bytes=out.dropped + err.dropped,
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
                        "dropped_bytes": r.dropped_bytes,
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
        self.note("sftp.put", f"{local} -> {remote}" + (f" (mode {mode:o})" if mode is not None else ""))

    def put_text(self, remote: str, text: str, mode: int) -> None:
        """Write `text` to a file on the node over SFTP, with `mode` set before any byte is written."""
        with self.sftp() as sftp, sftp.open(remote, "w") as fh:
            fh.chmod(mode)
            fh.write(text.encode())
        self.note("sftp.put", f"{len(text)} characters -> {remote} (mode {mode:o})")

    def note(self, kind: str, message: str) -> None:
        if self.database_url is None:
            return
        with session_scope(self.database_url) as session:
            session.add(Event(node_id=self.node_id, kind=f"node.{kind}", message=message, data={"node": self.name}))
