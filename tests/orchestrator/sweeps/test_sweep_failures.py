"""A sweep always ends and never leaves a node up: each failure a review reproduced, over real SSH.

Reproduced on the code before this fix: a copy-back error that is not a NodeError left the sweep in
`collecting` for good; teardown raising inside the provisioning error path left it in
`provisioning`, re-bootstrapping every tick; two runners bootstrapped the same nodes twice.
"""

from __future__ import annotations

import os
import pwd
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from orchestrator.app import create_app
from orchestrator.db.models import Event, Grid, Node, Run, Schedule, Sweep
from orchestrator.db.session import session_scope
from orchestrator.fleet.bootstrap import BootstrapConfig
from orchestrator.fleet.inventory import find_node
from orchestrator.settings import Settings
from orchestrator.sweeps.lock import runner_lock
from orchestrator.sweeps.runner import SweepRunner
from orchestrator.sweeps.schedules import ScheduleCreate, create_schedule, get_schedule
from orchestrator.vocabulary import NodeState, RunState, SweepState
from tests.kit.clock import FakeClock
from tests.kit.nodes import add_ssh_node

GRID = {"name": "nightly", "arms": ["A"], "overrides": {"model": {"size": "tiny"}}}
DAY = datetime(2026, 2, 2, tzinfo=UTC)


@pytest.fixture(scope="module")
def node_name(database_url: str, sshd) -> str:  # noqa: ANN001
    return add_ssh_node(database_url, sshd, "flaky-node", price_per_hour=1.0)


@pytest.fixture(autouse=True)
def _one_schedule_at_a_time(database_url: str) -> None:
    with session_scope(database_url) as session:
        for schedule in session.scalars(select(Schedule)):
            schedule.paused = True
        for node in session.scalars(select(Node)):
            node.state = NodeState.registered
        for sweep in session.scalars(select(Sweep).where(Sweep.under_way)):  # an earlier test's, left running
            sweep.state = SweepState.failed


def _config(remote: Path, **kw: object) -> BootstrapConfig:
    values: dict[str, object] = {
        "python": sys.executable,
        "remote_dir": remote.relative_to(pwd.getpwuid(os.getuid()).pw_dir).as_posix(),
        "install": ["{python} -c 'print(1)'"],
        "start": ["echo joined > {remote_dir}/joined"],
        "leave": ["rm -f {remote_dir}/joined"],
        "command_timeout_s": 60,
    }
    return BootstrapConfig(**{**values, **kw})


def _runner(database_url: str, storage: Path, clock: FakeClock, config: BootstrapConfig) -> SweepRunner:
    return SweepRunner(
        database_url, storage, clock=clock, node_config=config, teardown_attempts=2, teardown_backoff_s=0.01
    )


def _fire(database_url: str, name: str, node: str, clock: FakeClock) -> None:
    with session_scope(database_url) as session:
        grid = {**GRID, "name": name}
        create_schedule(session, ScheduleCreate(name=name, cron="0 22 * * *", grid=grid, nodes=[node]), now=clock.now)
    clock.now = DAY.replace(hour=22)


def _sweep(database_url: str, schedule: str) -> Sweep:
    with session_scope(database_url) as session:
        sid = get_schedule(session, schedule).id
        [sweep] = session.scalars(select(Sweep).where(Sweep.schedule_id == sid))
        return sweep


def _running_sweep(
    database_url: str, name: str, node: str, remote: Path, storage: Path
) -> tuple[SweepRunner, FakeClock, Sweep]:
    """A schedule fired at 22:00 and its sweep provisioned by one tick of a runner."""
    clock = FakeClock(DAY)
    _fire(database_url, name, node, clock)
    runner = _runner(database_url, storage, clock, _config(remote))
    runner.tick()
    return runner, clock, _sweep(database_url, name)


def _commands(database_url: str, needle: str) -> int:
    with session_scope(database_url) as session:
        return session.scalar(select(func.count()).where(Event.kind == "node.command", Event.message.contains(needle)))


def _finish_runs(database_url: str, grid_id: int, **fields: object) -> list[Run]:
    with session_scope(database_url) as session:
        runs = list(session.get_one(Grid, grid_id).runs)
        for run in runs:
            run.state = RunState.completed
            for k, v in fields.items():
                setattr(run, k, v)
        return runs


def test_copy_back_os_error_ends_the_sweep_and_releases_the_node(
    database_url: str,
    sshd,  # noqa: ANN001
    node_name: str,
    tmp_path: Path,
) -> None:
    remote = sshd.workdir / "copyfail"
    runner, clock, sweep = _running_sweep(database_url, "copyfail", node_name, remote, tmp_path / "storage")
    assert sweep.state == SweepState.running
    ckpt = remote / "ckpt"
    ckpt.mkdir()
    (ckpt / "best.pt").write_bytes(b"w")
    [run] = _finish_runs(database_url, sweep.grid_id, node=node_name, checkpoint_dir=str(ckpt))
    # The local side cannot take the copy: its directory's name is taken by a file (an OSError, not a NodeError).
    blocked = tmp_path / "storage" / "sweeps" / str(sweep.id) / "runs" / f"{run.id}-{run.arm}"
    blocked.parent.mkdir(parents=True)
    blocked.write_text("in the way")

    clock.now = DAY.replace(hour=23)
    runner.tick()
    sweep = _sweep(database_url, "copyfail")
    assert sweep.state == SweepState.failed
    assert "copying results from flaky-node: FileExistsError" in sweep.error
    assert not (remote / "joined").exists()  # the node's Ray stopped (leave)
    assert (ckpt / "best.pt").exists()  # its files are kept on the node, since they were not copied
    spend = sweep.spend
    clock.now = DAY.replace(hour=23, minute=30)
    runner.tick()  # ended for good: no retries, the spend stops
    assert (_sweep(database_url, "copyfail").state, _sweep(database_url, "copyfail").spend) == ("failed", spend)


def test_teardown_error_in_the_provisioning_error_path_ends_the_sweep_and_marks_the_node(
    database_url: str,
    sshd,  # noqa: ANN001
    node_name: str,
    tmp_path: Path,
    ablate_cli,  # noqa: ANN001
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    remote = sshd.workdir / "provfail"
    clock = FakeClock(DAY)
    _fire(database_url, "provfail", node_name, clock)
    # Install fails; the leave template then raises AttributeError (not a NodeError) on every attempt.
    config = _config(remote, install=["exit 3"], leave=["{remote_dir.nope}"])
    runner = _runner(database_url, tmp_path / "storage", clock, config)
    runner.tick()
    sweep = _sweep(database_url, "provfail")
    assert sweep.state == SweepState.failed
    assert sweep.error.startswith("provisioning flaky-node: node 'flaky-node': `exit 3` exited 3")
    assert "tearing down flaky-node failed 2 times: AttributeError" in sweep.error
    with session_scope(database_url) as session:
        assert find_node(session, node_name).state == NodeState.teardown_failed
    clock.now = DAY.replace(hour=22, minute=5)
    runner.tick()
    assert _commands(database_url, "exit 3") == 1  # never bootstrapped again

    # Shown in red where the operator looks: the dashboard and `ablate schedules list`.
    client = TestClient(create_app(Settings(database_url=database_url, home_dir=tmp_path), "t"))
    page = client.get("/").text
    assert 'id="unreleased"' in page and "Teardown failed on flaky-node" in page
    assert '<span class="chip node-teardown_failed" title="flaky-node: teardown_failed">' in page
    monkeypatch.setenv("COLUMNS", "250")
    listed = ablate_cli(database_url, "schedules", "list")
    assert listed.returncode == 0, listed.stderr
    assert "flaky-node (TEARDOWN FAILED)" in listed.stdout


def test_exception_while_collecting_fails_the_sweep_after_teardown(
    database_url: str,
    sshd,  # noqa: ANN001
    node_name: str,
    tmp_path: Path,
) -> None:
    remote = sshd.workdir / "collectfail"
    runner, clock, sweep = _running_sweep(database_url, "collectfail", node_name, remote, tmp_path / "storage")
    _finish_runs(database_url, sweep.grid_id)
    (tmp_path / "storage" / "sweeps").mkdir(parents=True)
    (tmp_path / "storage" / "sweeps" / str(sweep.id)).write_text("not a directory")  # results dir cannot be made
    clock.now = DAY.replace(hour=23)
    runner.tick()
    sweep = _sweep(database_url, "collectfail")
    assert sweep.state == SweepState.failed
    assert sweep.error.startswith("collecting: FileExistsError")
    assert not remote.exists()  # torn down all the same
    with session_scope(database_url) as session:
        assert find_node(session, node_name).state == NodeState.registered


def test_a_report_that_cannot_be_written_keeps_the_results_and_the_sweep_completes(
    database_url: str,
    sshd,  # noqa: ANN001
    node_name: str,
    tmp_path: Path,
) -> None:
    """Was: every run completed, the report failed (an honest diverged arm's "nan" once did it), and the
    whole sweep was `failed`. Now the results are kept, the sweep is its runs' and the report's failure is said."""
    remote = sshd.workdir / "reportfail"
    runner, clock, sweep = _running_sweep(database_url, "reportfail", node_name, remote, tmp_path / "storage")
    _finish_runs(database_url, sweep.grid_id)
    results = tmp_path / "storage" / "sweeps" / str(sweep.id)
    results.mkdir(parents=True)
    (results / "report").write_text("in the way")  # the report's directory cannot be made
    clock.now = DAY.replace(hour=23)
    runner.tick()
    sweep = _sweep(database_url, "reportfail")
    assert (sweep.state, sweep.error) == (SweepState.completed, None)
    assert (results / "metrics.json").exists() and sweep.results_dir == str(results)
    with session_scope(database_url) as session:
        [said] = session.scalars(select(Event.message).where(Event.kind == "sweep.report_failed",
                                                             Event.grid_id == sweep.grid_id)).all()  # fmt: skip
        [done] = session.scalars(select(Event.message).where(Event.kind == "sweep.completed",
                                                             Event.grid_id == sweep.grid_id)).all()  # fmt: skip
    assert f"the report could not be written into {results / 'report'}: FileExistsError" in said
    assert "are kept" in said and "the report could not be written" in done
    assert not remote.exists()  # torn down as any ended sweep


def test_two_runners_never_advance_one_sweep_twice(
    database_url: str,
    sshd,  # noqa: ANN001
    node_name: str,
    tmp_path: Path,
) -> None:
    remote = sshd.workdir / "tworunners"
    clock = FakeClock(DAY)
    _fire(database_url, "tworunners", node_name, clock)
    config = _config(remote, install=["sleep 2 && echo installed-tworunners"])  # the first tick is long
    runners = [_runner(database_url, tmp_path / "storage", clock, config) for _ in range(2)]
    start = threading.Barrier(2)
    results: list[bool] = []

    def tick(runner: SweepRunner) -> None:
        start.wait()
        results.append(runner.tick())

    threads = [threading.Thread(target=tick, args=(r,)) for r in runners]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results) == [False, True]
    sweep = _sweep(database_url, "tworunners")  # exactly one sweep
    assert sweep.state == SweepState.running
    assert _commands(database_url, "installed-tworunners") == 1  # bootstrapped once
    with session_scope(database_url) as session:
        grids = session.scalar(select(func.count()).select_from(Grid).where(Grid.name.startswith("tworunners @")))
    assert grids == 1


def test_a_held_runner_lock_keeps_another_runner_idle(database_url: str) -> None:
    with runner_lock(database_url) as first:
        with runner_lock(database_url) as second:
            assert (first, second) == (True, False)
    with runner_lock(database_url) as again:
        assert again


def test_a_schedule_whose_node_is_in_another_sweep_does_not_fire(
    database_url: str,
    sshd,  # noqa: ANN001
    node_name: str,
    tmp_path: Path,
) -> None:
    remote = sshd.workdir / "busy"
    clock = FakeClock(DAY.replace(day=9))
    _fire(database_url, "first", node_name, clock)
    with session_scope(database_url) as session:
        body = ScheduleCreate(name="second", cron="0 22 * * *", grid={**GRID, "name": "second"}, nodes=[node_name])
        create_schedule(session, body, now=DAY.replace(day=9, hour=12))
    clock.now = DAY.replace(day=9, hour=22)  # both are due: the first (by id) takes the node
    runner = _runner(database_url, tmp_path / "storage", clock, _config(remote))
    runner.tick()
    assert _sweep(database_url, "first").state == SweepState.running
    with session_scope(database_url) as session:
        second = get_schedule(session, "second")
        assert session.scalar(select(func.count()).select_from(Sweep).where(Sweep.schedule_id == second.id)) == 0
        busy = session.scalars(select(Event.message).where(Event.kind == "schedule.nodes_busy")).all()
    assert busy == [f"second: nodes in use by {node_name} (sweep {_sweep(database_url, 'first').id}); fire skipped"]
