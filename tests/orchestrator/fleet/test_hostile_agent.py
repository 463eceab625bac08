"""A node whose agent is hostile: the real launcher drives a run on it and refuses everything it sends.

The "node" is a stand-in agent process speaking the agent protocol over pipes, the same byte stream
and the same AgentLink the controller uses over a node's SSH channel. Each mode sends one kind of attack
on the first poll: a pickle whose unpickling would create a canary file, malformed JSON, a reply over
the size limit, a name with `..`, a reply that never ends, records claiming another run. For each, the
run ends failed with a reason that says what was refused, the canary never appears, and the launcher
keeps running.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from orchestrator.db.models import Event
from orchestrator.db.session import session_scope
from orchestrator.fleet.agent_link import AgentLink, AgentProtocolError, ProcessStream
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.runs.launcher import Launcher
from orchestrator.settings import Settings
from tests.kit.polling import wait_for
from tests.kit.readers import run_of
from tests.kit.settings import tiny_overrides
from worker.protocol import PollRequest, PollResult

HOSTILE = Path(__file__).with_name("hostile_agent.py")  # the node agent: MODE CANARY
REFUSED = {
    "pickle": "refused a reply that is not JSON",
    "malformed": "refused a reply that is not JSON",
    "huge": "refused a reply over",
    "traversal": "refused an invalid poll reply: runs.../../etc/passwd",
    "endless": "refused a reply over",
    "other-run": "claims run",
}


@pytest.mark.parametrize("mode", list(REFUSED))
def test_what_a_hostile_node_sends_is_refused_and_nothing_executes(
    mode: str, database_url: str, tmp_path: Path
) -> None:
    canary = tmp_path / "canary"
    settings = Settings(
        database_url=database_url, home_dir=tmp_path / "storage", launcher_interval_s=0.2, max_retries=0
    )
    launcher = Launcher(settings, local_agent=[sys.executable, str(HOSTILE), mode, str(canary)])
    with session_scope(database_url) as session:
        grid = create_grid(session, GridCreate(name=f"hostile-{mode}", arms=["A"], overrides=tiny_overrides(steps=4)))
        run_id = grid.runs[0].id
    launcher.start()
    try:
        wait_for(lambda: run_of(database_url, run_id).state == "failed", f"the {mode} node's run to fail", 60)
        assert launcher._thread is not None and launcher._thread.is_alive()  # the controller serves on
    finally:
        assert launcher.stop()
    run = run_of(database_url, run_id)
    assert REFUSED[mode] in (run.error or ""), run.error
    assert not canary.exists(), "something the node sent was executed"
    with session_scope(database_url) as session:
        kinds = list(session.scalars(select(Event.kind).where(Event.run_id == run_id)))
    assert "started" not in kinds and "checkpoint" not in kinds  # nothing of the reply was stored



def test_a_reply_begun_and_never_ended_is_refused_at_the_deadline(tmp_path: Path) -> None:
    """A trickle under the size limit: the link gives up at its deadline and says the reply never ended."""
    stream = ProcessStream([sys.executable, str(HOSTILE), "trickle", str(tmp_path / "canary")], {}, tmp_path / "log")
    link = AgentLink("slow", stream)
    try:
        assert link.hello().gpus == 1
        started = time.monotonic()
        with pytest.raises(AgentProtocolError, match="without an end") as refused:
            link.request(PollRequest(runs={"ablate-run-1-0": None}, wait_s=0.1), PollResult, 2.0)
        assert refused.value.violation and time.monotonic() - started < 10
        assert link.closed
    finally:
        link.close()


def test_a_joined_node_whose_agent_sends_a_pickle_over_ssh_is_refused_and_marked(
    database_url: str, sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    """The same over a real SSH channel (the loopback OpenSSH server): the node's `agent` launcher is the
    hostile agent. The node is marked bootstrap_failed with what was refused, and its run fails."""
    from orchestrator.db.models import Node
    from orchestrator.fleet.probe import probe_node
    from tests.kit.nodes import add_ssh_node

    remote = sshd.workdir / "hostile"
    remote.mkdir()
    canary = tmp_path / "canary"
    launcher = remote / "agent"  # what bootstrap would have written: here, a hostile stand-in
    launcher.write_text(f"#!/bin/sh\nexec {sys.executable} {HOSTILE} pickle {canary}\n")
    launcher.chmod(0o700)
    monkeypatch.setenv("ABLATE_NODE_REMOTE_DIR", sshd.relative(remote))
    name = add_ssh_node(database_url, sshd, "hostile-node")
    probe_node(database_url, name)  # its GPUs as the controller found them (the stand-in nvidia-smi's 4)
    with session_scope(database_url) as session:
        session.scalars(select(Node).where(Node.name == name)).one().state = "joined"
        grid = create_grid(session, GridCreate(name="hostile-ssh", arms=["A"], overrides=tiny_overrides(steps=4)))
        run_id = grid.runs[0].id
    settings = Settings(
        database_url=database_url, home_dir=tmp_path / "storage", launcher_interval_s=0.2, max_retries=0,
        local_node=False,
    )
    launcher = Launcher(settings)
    launcher.start()
    try:
        wait_for(lambda: run_of(database_url, run_id).state == "failed", "the hostile node's run to fail", 60)
    finally:
        assert launcher.stop()
    run = run_of(database_url, run_id)
    assert "node hostile-node refused" in run.error and "not JSON" in run.error, run.error
    with session_scope(database_url) as session:
        node = session.scalars(select(Node).where(Node.name == name)).one()
        assert node.state == "bootstrap_failed" and node.state_detail.startswith("agent: "), node.state_detail
        assert "refused a reply that is not JSON" in node.state_detail
    assert not canary.exists()
