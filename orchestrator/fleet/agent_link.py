"""The controller's end of a node agent (worker/agent.py): one JSON request, one JSON reply, validated.

A node is a stranger: whatever its agent sends is input like a request body. A reply is one line of at
most MAX_REPLY_BYTES, parsed as JSON (never unpickled), and checked against the protocol's models
(worker/protocol.py, the one definition both ends import) before anything reads it; names and paths in
it are never followed. A reply that breaks the protocol (not
JSON, too long, the wrong id, no reply within the time) raises AgentProtocolError and closes the link:
the stream's state is unknown after it. An op the agent answered with an error raises AgentRefused and
the link stays usable.

The byte stream is the node's pinned SSH connection (a channel running the agent, one per node, held
open: no handshake per poll) or, for the controller's own machine, the agent's pipes.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from orchestrator.fleet.errors import NodeError
from worker.protocol import (
    MAX_REPLY_BYTES,
    Found,
    Hello,
    HelloRequest,
    KillRequest,
    OpRequest,
    PingRequest,
    PollRequest,
    PollResult,
    Started,
    StartRequest,
    StopRequest,
    WorkerArgs,
    WorkerInfo,
    WorkerLost,
    WorkerReply,
    first_error,
)

if TYPE_CHECKING:
    import paramiko

Reply = TypeVar("Reply", bound=BaseModel)

HELLO_TIMEOUT_S = 180.0  # the agent's Ray start on a busy node
OP_TIMEOUT_S = 60.0
MAX_DEPTH = 32  # nesting of a reply: a record's values sit 5 levels down, its provenance a few more


class AgentProtocolError(NodeError):
    """The link failed and is closed; the message says why. `violation`: the agent broke the protocol
    (what it sent was refused), as opposed to a stream that ended or went silent; `silent`: nothing at
    all came within the deadline."""

    def __init__(self, message: str, violation: bool = True, silent: bool = False) -> None:
        super().__init__(message)
        self.violation = violation
        self.silent = silent


class AgentRefused(NodeError):
    """The agent answered an op with an error (the link stays usable)."""


def parse_reply(line: bytes) -> Any:
    """One reply line as JSON, nested at most MAX_DEPTH deep; ValueError says why not. Python's parser
    itself raises RecursionError on deep nesting and ValueError on an integer past 4,300 digits: both
    are a reply that is not JSON here, never an error that escapes the link."""
    try:
        value = json.loads(line)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_DEPTH}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 at byte {exc.start}") from None
    except ValueError as exc:  # JSONDecodeError, or an integer too long to convert
        raise ValueError(str(exc).split(";")[0][:120]) from None
    stack = [(value, 1)]
    while stack:  # iterative: a deep reply must not recurse here either
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        if children and depth >= MAX_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DEPTH}")
        stack.extend((child, depth + 1) for child in children)
    return value


# -- byte streams -------------------------------------------------------------------------------------


class ProcessStream:
    """The agent as a child process of the controller (its own machine): stdin/stdout pipes."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path) -> None:
        import signal

        from worker.node_ray import end_with_parent

        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as err:
            self.proc = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env,
                start_new_session=True, preexec_fn=end_with_parent(signal.SIGTERM),  # ends with the controller
            )  # fmt: skip

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def recv(self, timeout_s: float) -> bytes | None:
        """Bytes, b"" at end of stream, None when nothing came within timeout_s."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], max(timeout_s, 0.0))
        return os.read(fd, 1 << 16) if ready else None

    def close(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=20)  # stdin closed: the agent ends (and a Ray of its own with it)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ChannelStream:
    """The agent on a node, on one channel of the node's SSH connection (the client is owned here)."""

    def __init__(self, client: paramiko.SSHClient, command: str) -> None:
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            raise NodeError("SSH connection lost before the agent started")
        self.client = client
        self.channel = transport.open_session()
        self.channel.exec_command(command)

    def send(self, data: bytes) -> None:
        import paramiko

        try:
            self.channel.sendall(data)
        except paramiko.SSHException as exc:  # as OSError: the link's failure, not the caller's
            raise OSError(str(exc)) from None

    def recv(self, timeout_s: float) -> bytes | None:
        import paramiko

        self.channel.settimeout(max(timeout_s, 0.001))
        try:
            return self.channel.recv(1 << 16)
        except TimeoutError:
            return None
        except paramiko.SSHException as exc:
            raise OSError(str(exc)) from None

    def close(self) -> None:
        try:
            self.channel.close()
        finally:
            self.client.close()


class AgentLink:
    """Requests to one node's agent over a byte stream; every reply validated before use."""

    def __init__(self, name: str, stream: ProcessStream | ChannelStream, max_reply_bytes: int = MAX_REPLY_BYTES):
        self.name = name
        self.stream = stream
        self.max_reply_bytes = max_reply_bytes
        self.closed = False
        self._ids = itertools.count(1)
        self._buffer = b""

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.stream.close()

    def _refuse(self, why: str, violation: bool = True, silent: bool = False) -> AgentProtocolError:
        self.close()
        return AgentProtocolError(f"node {self.name!r}: {why}", violation, silent)

    def _readline(self, timeout_s: float, silence_s: float | None = None) -> bytes:
        """One line within timeout_s; with silence_s, its first byte within silence_s (a node that says
        nothing is given up on sooner than one whose long reply is still arriving)."""
        start = time.monotonic()
        deadline = start + timeout_s
        while b"\n" not in self._buffer:
            if len(self._buffer) > self.max_reply_bytes:
                raise self._refuse(f"refused a reply over {self.max_reply_bytes} bytes")
            if silence_s is not None and not self._buffer and time.monotonic() - start >= silence_s:
                raise self._refuse(f"no reply within {silence_s:g} s", violation=False, silent=True)
            left = deadline - time.monotonic()
            if left <= 0:
                # Silence is a lost link; a reply begun and never ended is the agent's doing.
                partial = f" ({len(self._buffer)} bytes without an end)" if self._buffer else ""
                raise self._refuse(f"no complete reply within {timeout_s:g} s{partial}", bool(self._buffer))
            try:
                chunk = self.stream.recv(min(left, 1.0))
            except OSError as exc:
                raise self._refuse(f"the agent's stream failed: {type(exc).__name__}: {exc}", False) from None
            if chunk == b"":
                raise self._refuse("the agent's stream ended (agent exited or the connection dropped)", False)
            self._buffer += chunk or b""
        line, _, self._buffer = self._buffer.partition(b"\n")
        if len(line) > self.max_reply_bytes:
            raise self._refuse(f"refused a reply over {self.max_reply_bytes} bytes")
        return line

    def request(
        self, body: OpRequest, reply: type[Reply], timeout_s: float = OP_TIMEOUT_S, silence_s: float | None = None
    ) -> Reply:
        """Send one request (worker/protocol.py; its id is set here) and return its `result` checked against
        `reply`; the reply must begin within silence_s when given and end within timeout_s."""
        if self.closed:
            raise AgentProtocolError(f"node {self.name!r}: the link is closed", violation=False)
        request_id = next(self._ids)
        op = body.op
        try:
            self.stream.send(body.model_copy(update={"id": request_id}).model_dump_json().encode() + b"\n")
        except OSError as exc:
            raise self._refuse(f"could not send to the agent: {type(exc).__name__}: {exc}", False) from None
        line = self._readline(timeout_s, silence_s)
        try:
            answer = parse_reply(line)
        except ValueError as exc:
            why = f"{exc}; {len(line)} bytes from {line[:24]!r}"
            raise self._refuse(f"refused a reply that is not JSON ({why})") from None
        if not isinstance(answer, dict) or answer.get("id") != request_id or not isinstance(answer.get("ok"), bool):
            raise self._refuse(f"refused a reply that is not an answer to request {request_id}")
        if not answer["ok"]:
            raise AgentRefused(f"node {self.name!r}: {op}: {str(answer.get('error'))[:2000]}")
        try:
            return reply.model_validate(answer.get("result"))
        except ValidationError as exc:
            raise self._refuse(f"refused an invalid {op} reply: {first_error(exc)}") from None

    # -- ops ----------------------------------------------------------------------------------------

    def hello(self, timeout_s: float = HELLO_TIMEOUT_S) -> Hello:
        return self.request(HelloRequest(), Hello, timeout_s)

    def start(self, name: str, args: WorkerArgs) -> Started:
        return self.request(StartRequest(name=name, args=args), Started)

    def poll(
        self, runs: dict[str, int | None], wait_s: float, grace_s: float = OP_TIMEOUT_S
    ) -> dict[str, WorkerReply | WorkerLost]:
        """The workers' news. The agent answers within wait_s: silence past wait_s + grace_s fails the
        link as silent; a reply begun has until wait_s + OP_TIMEOUT_S to end."""
        body = PollRequest(runs=runs, wait_s=wait_s)
        replies = self.request(body, PollResult, timeout_s=wait_s + OP_TIMEOUT_S, silence_s=wait_s + grace_s).runs
        return {name: reply for name, reply in replies.items() if name in runs}  # others: not asked, ignored

    def stop(self, name: str) -> Found:
        return self.request(StopRequest(name=name), Found)

    def kill(self, name: str) -> Found:
        return self.request(KillRequest(name=name), Found)

    def ping(self, name: str) -> WorkerInfo:
        return self.request(PingRequest(name=name), WorkerInfo)


def open_link(name: str, make_stream: Callable[[], ProcessStream | ChannelStream]) -> tuple[AgentLink, Hello]:
    """A link whose agent said hello (validated), or the error that says why not."""
    link = AgentLink(name, make_stream())
    try:
        return link, link.hello()
    except BaseException:
        link.close()
        raise
