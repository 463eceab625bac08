"""A node's text with terminal escapes in it, over a real SSH channel (the loopback OpenSSH server): the
node's agent reports its worker's error as OSC 52 (write the operator's clipboard), OSC 0 (retitle the
window) and CSI (clear the screen). The run fails with the error stored as sent, and `ablate status`
prints it with nothing a terminal would act on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from orchestrator.db.models import Node, Run
from orchestrator.db.session import session_scope
from orchestrator.fleet.probe import probe_node
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.runs.launcher import Launcher
from orchestrator.settings import Settings
from tests.kit.net import controller_env
from tests.kit.nodes import add_ssh_node
from tests.kit.polling import wait_for
from tests.kit.settings import tiny_overrides

ESCAPES = "\x1b]52;c;cm0gLXJmIH4K\x07\x1b]0;pwned\x1b\\\x1b[2J\x1b[31m\x9b1m\u202e"
AGENT = Path(__file__).with_name("hostile_agent.py")  # error-text MODE: its worker fails with ARG


def test_a_node_s_terminal_escapes_never_reach_the_operator_s_terminal(
    database_url: str, sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    remote = sshd.workdir / "escapes"
    remote.mkdir()
    launcher = remote / "agent"  # what bootstrap would have written: here, the hostile stand-in
    error = f"RuntimeError: boom{ESCAPES} at step 3"
    launcher.write_text(f"#!/bin/sh\nexec {sys.executable} {AGENT} error-text '{error}'\n")
    launcher.chmod(0o700)
    monkeypatch.setenv("ABLATE_NODE_REMOTE_DIR", sshd.relative(remote))
    name = add_ssh_node(database_url, sshd, "escaping-node")
    probe_node(database_url, name)  # its GPUs as the controller found them: a node's own claim is not enough
    with session_scope(database_url) as session:
        session.scalars(select(Node).where(Node.name == name)).one().state = "joined"
        grid = create_grid(session, GridCreate(name="escapes", arms=["A"], overrides=tiny_overrides(steps=4)))
        grid_id, run_id = grid.id, grid.runs[0].id
    settings = Settings(database_url=database_url, home_dir=tmp_path / "storage", launcher_interval_s=0.2,
                        max_retries=0, local_node=False)  # fmt: skip
    launcher = Launcher(settings)
    launcher.start()
    try:
        wait_for(lambda: _error(database_url, run_id), "the node's run to fail", 60)
    finally:
        assert launcher.stop()
    assert "\x1b]52" in _error(database_url, run_id), "the stored error is what the node sent"

    env = {**os.environ, "ABLATE_DATABASE_URL": database_url, "COLUMNS": "300", "PYTHONPATH": os.getcwd()}
    with controller_env(database_url, tmp_path / "controller") as controller:  # `status` reads a controller
        shown = subprocess.run([sys.executable, "-c", "from orchestrator.cli import main; main()", "status",
                                str(grid_id)], env={**env, **controller}, capture_output=True, text=True,
                               timeout=120)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "boom" in shown.stdout and "at step 3" in shown.stdout, shown.stdout
    for bad in ("\x1b", "\x07", "\x9b", "\u202e", "52;c;"):
        assert bad not in shown.stdout, f"{bad!r} reached the terminal: {shown.stdout!r}"


def _error(database_url: str, run_id: int) -> str:
    with session_scope(database_url) as session:
        run = session.get_one(Run, run_id)
        return run.error or "" if run.state == "failed" else ""
