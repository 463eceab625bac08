"""The nodes the launcher trains on, each reached through its agent: the controller's own machine (a
child process) and every joined node (a channel on its pinned SSH connection), one link per node.

Links open in the background (an agent's Ray may take seconds to start), so a slow or dead node never
holds up the others. A link that fails is reopened with a back-off; the launcher treats a node's
workers as lost once the node has been unreachable for `node_lost_s`, at once when its agent broke the
protocol (a hostile or broken node: a joined one is then marked `bootstrap_failed` with the reason, so
no run goes there until an operator bootstraps it again).

What an agent's hello claims is checked, not believed: a joined node that names a worker the controller
never placed there breaks the protocol (the launcher says which names were placed where), and a node's
usable GPUs are the lower of its claim and what the controller found itself: the rental's count for a
rented node, else the last probe's.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import select

from orchestrator.db.models import Event, Node, RentedInstance
from orchestrator.db.session import session_scope
from orchestrator.fleet.agent_link import (
    AgentLink,
    AgentProtocolError,
    ChannelStream,
    ProcessStream,
    open_link,
)
from orchestrator.fleet.errors import NodeError, error_reason
from orchestrator.settings import Settings
from orchestrator.vocabulary import LOCAL_NODE, NodeState
from worker.protocol import Found, Started, WorkerArgs, WorkerLost, WorkerReply

log = logging.getLogger("ablate.nodes")
Answer = TypeVar("Answer")

LOCAL = LOCAL_NODE
RECONNECT_S = 5.0  # between attempts to reopen a failed link
# How long past its wait a poll may go without the first byte of its reply (an agent answers within the
# wait plus a second): a silent node holds up a pass no longer than this, and is refused once its polls
# have gone unanswered for node_lost_s.
POLL_GRACE_S = 5.0


def local_agent_command(settings: Settings) -> tuple[list[str], dict[str, str]]:
    """The agent of the controller's own machine: joins ABLATE_RAY_ADDRESS when set, else runs a Ray of
    its own (with ABLATE_LOGICAL_GPUS logical GPUs when set)."""
    command = [sys.executable, "-m", "worker.agent", "serve", "--namespace", settings.ray_namespace]
    env = dict(os.environ)
    if settings.ray_address:
        command += ["--address", settings.ray_address]
        token = settings.cluster_token_file
        if token is not None:
            env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)})
    elif settings.logical_gpus > 0:
        command += ["--local-gpus", str(settings.logical_gpus)]
    return command, env


def remote_agent_command(settings: Settings, remote_dir: str) -> str:
    """The agent of a joined node: the launcher its bootstrap wrote, with the node's own Ray."""
    d = shlex.quote(remote_dir)
    return f"{d}/agent serve --namespace {shlex.quote(settings.ray_namespace)} --ray-dir {d}/ray"


@dataclass
class NodeEntry:
    """One node as the pool holds it: its link when up, what its agent said, and why it is down."""

    name: str
    link: AgentLink | None = None
    gpus: int = 0
    workers: set[str] = field(default_factory=set)  # worker names found at connect, plus those started since
    connecting: Future[Any] | None = None
    down_since: float | None = field(default_factory=time.monotonic)  # not (yet) connected since then
    last_attempt: float = 0.0
    error: str | None = None
    refused: str | None = None  # a protocol violation: its workers are lost at once
    gpu_cap: int | None = None  # the GPUs the controller found there (rental or probe); None: its own machine
    silent_since: float | None = None  # its first poll left unanswered since its last answered one


class NodePool:
    """Opens, holds and reopens one agent link per node; polls them in parallel."""

    def __init__(
        self,
        settings: Settings,
        local_command: list[str] | None = None,
        not_placed: Callable[[str, list[str]], list[str]] = lambda node, names: [],
    ) -> None:
        self.settings = settings
        self.local_command = local_command  # tests put a hostile agent here
        self.not_placed = not_placed  # (node, worker names) -> those the controller never placed on it
        self.nodes: dict[str, NodeEntry] = {}
        self._executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ablate-node")

    # -- membership ----------------------------------------------------------------------------------

    def wanted(self) -> dict[str, Node | None]:
        """The local machine (unless ABLATE_LOCAL_NODE=false) and every joined node."""
        out: dict[str, Node | None] = {LOCAL: None} if self.settings.local_node else {}
        with session_scope(self.settings.database_url) as session:
            for node in session.scalars(select(Node).where(Node.state == NodeState.joined)).all():
                session.expunge(node)
                out[node.name] = node
        return out

    def found_gpus(self, row: Node) -> int:
        """The GPUs the controller itself found on a joined node: the rental's count when it is rented,
        else its last probe's."""
        with session_scope(self.settings.database_url) as session:
            rented = session.scalar(
                select(RentedInstance.gpus)
                .where(RentedInstance.node_name == row.name)
                .order_by(RentedInstance.id.desc())
            )
        return rented if rented is not None else len(row.gpus or [])

    def refresh(self) -> dict[str, str]:
        """Open links to new nodes, reopen failed ones, drop nodes that left; the dropped, with why."""
        wanted = self.wanted()
        dropped = {}
        for name in [name for name in self.nodes if name not in wanted]:
            entry = self.nodes.pop(name)
            self._close(entry)
            dropped[name] = f"node {name} refused: {entry.refused}" if entry.refused else f"node {name} left"
        now = time.monotonic()
        for name, row in wanted.items():
            entry = self.nodes.setdefault(name, NodeEntry(name))
            if entry.connecting is not None and entry.connecting.done():
                self._connected(entry, entry.connecting)
            if entry.link is None and entry.connecting is None and now - entry.last_attempt >= RECONNECT_S:
                entry.last_attempt = now
                entry.gpu_cap = None if row is None else self.found_gpus(row)  # at each connect: a new probe counts
                entry.connecting = self._executor.submit(self._open, name, row)
        return dropped

    def _open(self, name: str, row: Node | None) -> tuple[AgentLink, Any]:
        if row is None:
            command, env = local_agent_command(self.settings)
            command = self.local_command or command
            log_path = self.settings.home_dir / "agent.log"
            return open_link(name, lambda: ProcessStream(command, env, log_path))
        from orchestrator.fleet.bootstrap import BootstrapConfig
        from orchestrator.fleet.shell import NodeShell

        remote = remote_agent_command(self.settings, BootstrapConfig().remote_dir)

        def channel() -> ChannelStream:
            shell = NodeShell.open(row)
            try:
                return ChannelStream(shell.client, remote)
            except BaseException:
                shell.client.close()
                raise

        return open_link(name, channel)

    def _connected(self, entry: NodeEntry, future: Future[Any]) -> None:
        entry.connecting = None
        try:
            link, hello = future.result()
        except Exception as exc:  # noqa: BLE001 - kept as the node's error; retried after RECONNECT_S
            entry.error = error_reason(exc)
            log.warning("node %s: agent not reachable: %s", entry.name, entry.error)
            if isinstance(exc, AgentProtocolError) and exc.violation:
                self.refuse(entry, entry.error)
            return
        foreign = self.not_placed(entry.name, hello.workers)
        if foreign and entry.name != LOCAL:  # the controller's own machine may hold another database's workers
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            link.close()
            entry.error = f"node {entry.name!r}: refused a hello naming workers it was never given: {shown}"
            log.warning("%s", entry.error)
            self.refuse(entry, entry.error)
            return
        gpus = hello.gpus if entry.gpu_cap is None else min(hello.gpus, entry.gpu_cap)
        if gpus < hello.gpus:
            log.warning("node %s claims %d GPUs; the controller found %d: using %d",
                        entry.name, hello.gpus, entry.gpu_cap, gpus)
        entry.link, entry.gpus = link, gpus
        entry.workers = set(hello.workers) - set(foreign)  # adopted only where they were placed
        entry.down_since, entry.error, entry.refused = None, None, None
        log.info("node %s: agent up (%s, %d GPUs, %d workers)", entry.name, hello.node, gpus, len(entry.workers))

    def all_heard(self) -> bool:
        """Every node is up, refused, or down past node_lost_s: a worker found on none of them is on no
        node (a restarted controller re-queues its run only then)."""
        now, limit = time.monotonic(), self.settings.node_lost_s
        return all(
            e.link is not None
            or e.refused is not None
            or (e.connecting is None and e.last_attempt > 0 and now - (e.down_since or now) >= limit)
            for e in self.nodes.values()
        )

    # -- failures ------------------------------------------------------------------------------------

    def fail(self, entry: NodeEntry, exc: BaseException) -> None:
        """A link that failed: closed, reopened later; a protocol violation refuses the node."""
        self._close(entry)
        entry.error = error_reason(exc)
        entry.down_since = entry.down_since or time.monotonic()
        if isinstance(exc, AgentProtocolError) and exc.silent:  # kept across reconnects: only a reply clears it
            entry.silent_since = entry.silent_since or time.monotonic()
        log.warning("node %s: %s", entry.name, entry.error)
        if isinstance(exc, AgentProtocolError) and exc.violation:
            self.refuse(entry, entry.error)

    def refuse(self, entry: NodeEntry, why: str) -> None:
        entry.refused = why
        if entry.name == LOCAL:
            return
        with session_scope(self.settings.database_url) as session:
            node = session.scalars(select(Node).where(Node.name == entry.name)).one_or_none()
            if node is not None:
                node.state, node.state_detail = NodeState.bootstrap_failed, f"agent: {why}"[:2000]
                session.add(Event(node_id=node.id, kind="node.refused", message=why[:2000]))

    def lost(self) -> dict[str, str]:
        """Nodes whose workers count as lost now, with the reason: refused, down past node_lost_s, or
        silent (polls unanswered) that long, which refuses it."""
        now, out, limit = time.monotonic(), {}, self.settings.node_lost_s
        for entry in self.nodes.values():
            if not entry.refused and entry.silent_since is not None and now - entry.silent_since >= limit:
                self.refuse(entry, f"no poll reply for {now - entry.silent_since:.0f} s (node_lost_s={limit:g})")
                entry.silent_since = None  # refused: it starts again only as a node that answers
            if entry.refused:
                out[entry.name] = f"node {entry.name} refused: {entry.refused}"
            elif entry.link is None and entry.down_since is not None:
                if now - entry.down_since >= limit and entry.last_attempt > 0:
                    out[entry.name] = f"node {entry.name} unreachable for {now - entry.down_since:.0f} s: {entry.error}"
        return out

    # -- talking to nodes ----------------------------------------------------------------------------

    def up(self) -> dict[str, NodeEntry]:
        return {name: e for name, e in self.nodes.items() if e.link is not None}

    def placeable(self) -> dict[str, NodeEntry]:
        """Nodes up whose last poll was answered: a silent one gets no new runs."""
        return {name: e for name, e in self.up().items() if e.silent_since is None}

    def find(self, worker: str) -> str | None:
        return next((name for name, e in self.up().items() if worker in e.workers), None)

    def poll(
        self, groups: dict[str, dict[str, int | None]], wait_s: float
    ) -> dict[str, dict[str, WorkerReply | WorkerLost]]:
        """Poll each node's workers in parallel (each agent answers within wait_s once anything is new);
        a node whose link fails is left out (see `fail`)."""
        futures = {
            name: self._executor.submit(self.nodes[name].link.poll, runs, wait_s, POLL_GRACE_S)  # type: ignore[union-attr]
            for name, runs in groups.items()
            if runs and name in self.up()
        }
        wait(list(futures.values()))
        out = {}
        for name, future in futures.items():
            try:
                out[name] = future.result()
            except Exception as exc:  # noqa: BLE001 - the node's problem, not the loop's
                self.fail(self.nodes[name], exc)
            else:
                self.nodes[name].silent_since = None
        return out

    def start(self, node: str, name: str, args: WorkerArgs) -> Started | None:
        """Start worker `name` on `node` (adopted when it is there already); None when the node is not up
        or the start failed (logged; a broken link is failed, see `fail`)."""
        started = self._send(node, f"start {name}", lambda link: link.start(name, args))
        if started is not None:
            self.nodes[node].workers.add(name)
        return started

    def stop(self, node: str, name: str) -> Found | None:
        """Ask worker `name` for a graceful stop (a final checkpoint); None when it could not be asked."""
        return self._send(node, f"stop {name}", lambda link: link.stop(name))

    def kill(self, node: str, name: str) -> Found | None:
        """End worker `name` at once; None when the node is not up or the kill failed (gone already)."""
        killed = self._send(node, f"kill {name}", lambda link: link.kill(name))
        if killed is not None:
            self.nodes[node].workers.discard(name)
        return killed

    def _send(self, node: str, what: str, send: Callable[[AgentLink], Answer]) -> Answer | None:
        entry = self.nodes.get(node)
        if entry is None or entry.link is None:
            return None
        try:
            return send(entry.link)
        except AgentProtocolError as exc:
            self.fail(entry, exc)
        except Exception:  # noqa: BLE001 - AgentRefused: the worker is gone already
            log.info("node %s: %s failed", node, what, exc_info=True)
        return None

    def upload_code(self, node: str, name: str, data: bytes) -> str | None:
        """A command arm's code archive onto `node` over its agent's SSH connection (fleet/code_upload.py):
        its path there; None for the controller's own machine, which reads the code in place."""
        entry = self.nodes.get(node)
        if entry is None or entry.link is None:
            raise NodeError(f"node {node} is not up")
        if not isinstance(entry.link.stream, ChannelStream):
            return None
        from orchestrator.fleet.bootstrap import BootstrapConfig
        from orchestrator.fleet.code_upload import upload_archive

        return upload_archive(entry.link.stream.client, BootstrapConfig().remote_dir, name, data)

    # -- shutdown ------------------------------------------------------------------------------------

    @staticmethod
    def _close(entry: NodeEntry) -> None:
        link, entry.link = entry.link, None
        if link is not None:
            try:
                link.close()
            except Exception:  # noqa: BLE001 - closing a broken stream
                log.debug("closing node %s's link failed", entry.name, exc_info=True)

    def close(self) -> None:
        """Close every link (the agents exit; detached workers train on for the next controller)."""
        for entry in self.nodes.values():
            if entry.connecting is not None:
                try:
                    entry.link = entry.connecting.result()[0]
                except Exception:  # noqa: BLE001 - it never opened
                    pass
            self._close(entry)
        self._executor.shutdown(wait=False)
