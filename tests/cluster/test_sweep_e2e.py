"""A whole overnight sweep on the test bed: cron fire on a controllable clock, two namespace nodes
each running its own Ray, reached over real SSH, five tiny arms trained on the nodes' logical GPUs by
the real launcher (its own process; the controller declares no GPUs), metrics streamed into the
database while arms run, detector decisions, results copied back, nodes torn down.

The sweep runner runs here with a clock the test moves: it compresses the hours before a budget
runs out; once the budget is reached the clock follows real time, so the spend after it is what a
real night would pay.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from orchestrator.app import create_app
from orchestrator.db.models import Event, Metric, Node, Run, Schedule, Sweep
from orchestrator.db.session import session_scope
from orchestrator.settings import Settings
from orchestrator.sweeps.runner import SweepRunner
from orchestrator.sweeps.schedules import ScheduleCreate, create_schedule, get_schedule
from orchestrator.vocabulary import TERMINAL_STATES, NodeState, RunDecision, RunState, SweepState
from tests.cluster.testbed import TestBed
from tests.kit.bed import launcher_process, node_config, register_node
from tests.kit.clock import FakeClock
from tests.kit.readers import grid_runs
from tests.kit.settings import bed_overrides

DAY = datetime(2026, 3, 2, tzinfo=UTC)
TINY = bed_overrides(steps=20, checkpoint_every=5)
# The fifth arm's learning rate explodes after step 5: the detector must stop it, keeping step 5.
EXPLODES = {"parent": "A", "name": "A-lr-x", "schedule": {"lr_explode_after": 5, "lr_explode_factor": 1e6}}
ARMS = ["A", "B", "C", {"parent": "A", "name": "A2"}, EXPLODES]


@dataclass
class Controller:
    database_url: str
    storage: Path
    bed: TestBed


@pytest.fixture(scope="module")
def controller(
    database_url: str, testbed: TestBed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Controller]:
    """Nodes registered, and the real launcher in its own process, reaching them through their agents."""
    for node in testbed.nodes:
        register_node(database_url, node, price_per_hour=1.0)
    storage = testbed.storage  # type: ignore[attr-defined]
    log = tmp_path_factory.mktemp("scheduler") / "launcher.log"
    with launcher_process(database_url, storage, log, "ablate-bed"):
        yield Controller(database_url, storage, testbed)


@pytest.fixture(autouse=True)
def _only_this_tests_schedule(database_url: str) -> None:
    """Each test's clock jumps to another night: earlier tests' schedules must not fire there too."""
    with session_scope(database_url) as session:
        for schedule in session.scalars(select(Schedule)):
            schedule.paused = True


def _schedule(
    c: Controller, name: str, clock: FakeClock, overrides: dict[str, Any], budget: float | None = None
) -> None:
    body = ScheduleCreate(
        name=name,
        cron="0 22 * * *",
        grid={"name": name, "arms": ARMS, "overrides": overrides},
        nodes=[n.name for n in c.bed.nodes],
        budget=budget,
    )
    with session_scope(c.database_url) as session:
        create_schedule(session, body, now=clock.now)


def _sweep(c: Controller, schedule: str) -> Sweep:
    with session_scope(c.database_url) as session:
        sid = get_schedule(session, schedule).id
        [sweep] = session.scalars(select(Sweep).where(Sweep.schedule_id == sid))
        return sweep


def _streaming(c: Controller, grid_id: int) -> bool:
    """An arm is still running and already has metrics in the database."""
    with session_scope(c.database_url) as session:
        return bool(
            session.scalar(
                select(func.count())
                .select_from(Metric)
                .join(Run, Metric.run_id == Run.id)
                .where(Run.grid_id == grid_id, Run.state == RunState.running)
            )
        )


def _started_on(c: Controller, grid_id: int) -> dict[str, tuple[str, str]]:
    """Arm -> (the node the controller started it on, CUDA_VISIBLE_DEVICES as the worker reported it)."""
    with session_scope(c.database_url) as session:
        rows = session.execute(
            select(Run.arm, Event.data)
            .join(Event, Event.run_id == Run.id)
            .where(Run.grid_id == grid_id, Event.kind == "started")
        ).all()
    return {arm: (data["node_name"], data["cuda_visible_devices"]) for arm, data in rows}


def _assert_torn_down(c: Controller) -> None:
    for node in c.bed.nodes:
        assert not (node.home / "ablate").exists()  # working dir, token and Ray temp dir removed
        session_file = node.home / "ablate" / "ray" / "session"
        assert not session_file.exists()
    with session_scope(c.database_url) as session:
        assert {n.state for n in session.scalars(select(Node))} == {NodeState.registered}
    # Only sshd remains of the node users' processes: no raylet, no worker.
    for node in c.bed.nodes:
        names = {Path(f"/proc/{pid}/comm").read_text().strip() for pid in c.bed.node_processes(node)}
        assert names <= {"sshd"}, names


def test_a_sweep_fires_trains_five_arms_on_two_nodes_copies_back_and_tears_down(controller: Controller) -> None:
    c = controller
    clock = FakeClock(DAY.replace(hour=12))
    _schedule(c, "bed-nightly", clock, TINY)
    runner = SweepRunner(c.database_url, c.storage, clock=clock, node_config=node_config(c.bed))

    clock.now = DAY.replace(hour=22, second=5)
    runner.tick()  # fires and provisions: both nodes join for real
    sweep = _sweep(c, "bed-nightly")
    assert sweep.state == SweepState.running, sweep.error
    assert sorted(r.arm for r in grid_runs(c.database_url, sweep.grid_id)) == ["A", "A-lr-x", "A2", "B", "C"]

    streamed = False
    deadline = time.monotonic() + 420
    while _sweep(c, "bed-nightly").state not in (SweepState.completed, SweepState.failed, SweepState.stopped):
        assert time.monotonic() < deadline, f"sweep still {_sweep(c, 'bed-nightly').state}"
        streamed = streamed or _streaming(c, sweep.grid_id)
        clock.now += timedelta(minutes=1)
        runner.tick()
        time.sleep(0.5)
    sweep = _sweep(c, "bed-nightly")
    assert sweep.state == SweepState.completed, sweep.error
    assert streamed  # metrics were in the database while an arm was still running

    runs = grid_runs(c.database_url, sweep.grid_id)
    exploded = next(r for r in runs if r.arm == "A-lr-x")
    assert {r.state for r in runs if r is not exploded} == {RunState.completed}
    assert all(r.decision is None for r in runs if r is not exploded)  # judged at every checkpoint: go on
    assert exploded.state == RunState.stopped, (exploded.state, exploded.error)
    assert exploded.decision in (RunDecision.DIVERGED, RunDecision.COLLAPSE) and exploded.decision_reason
    assert exploded.best_step == 5 and exploded.best_checkpoint
    placed = _started_on(c, sweep.grid_id)
    assert {node for node, _ in placed.values()} == {n.name for n in c.bed.nodes}  # both trained; no local node
    assert {gpu for _, gpu in placed.values()} <= {"0", "1"}  # one logical GPU of the node each

    results = Path(sweep.results_dir)
    for run in runs:
        copied = results / "runs" / f"{run.id}-{run.arm}"
        assert (copied / "best.pt").is_file(), sorted(p.name for p in copied.iterdir())
        # The node's copy is gone with its working dir; the controller's own storage never had it.
        assert not (c.storage / "runs" / str(run.id) / "best.pt").exists()
    _assert_torn_down(c)

    page = TestClient(create_app(Settings(database_url=c.database_url, home_dir=c.storage), "t")).get("/").text
    assert f'<tr data-sweep-id="{sweep.id}" data-state="completed">' in page
    assert f'<a href="/grids/{sweep.grid_id}">' in page


def test_the_budget_runs_out_mid_grid_arms_stop_gracefully_and_nodes_are_torn_down(controller: Controller) -> None:
    c = controller
    clock = FakeClock(DAY.replace(day=3, hour=12))
    long = {**TINY, "schedule": {**TINY["schedule"], "steps": 2000}}
    _schedule(c, "bed-capped", clock, long, budget=1.0)  # two nodes at 1.0/h: out after 30 minutes
    runner = SweepRunner(c.database_url, c.storage, clock=clock, node_config=node_config(c.bed))

    clock.now = DAY.replace(day=3, hour=22)
    runner.tick()
    sweep = _sweep(c, "bed-capped")
    assert sweep.state == SweepState.running, sweep.error

    deadline = time.monotonic() + 240
    cap = DAY.replace(day=3, hour=22, minute=20)
    while not _streaming(c, sweep.grid_id):  # arms train and report checkpoints; the night moves on
        assert time.monotonic() < deadline, "no arm reported a checkpoint"
        clock.now = min(clock.now + timedelta(minutes=1), cap)
        runner.tick()
        time.sleep(0.5)
    tick = timedelta(seconds=30)  # the runner's default interval
    while _sweep(c, "bed-capped").state == SweepState.running:  # ticks of a real night up to the budget
        clock.now += tick
        runner.tick()
    sweep = _sweep(c, "bed-capped")
    assert sweep.state == SweepState.stopping and sweep.stop_reason.startswith("budget 1 reached")
    # Noticed at the first tick past the budget: at most one tick of spend over it.
    assert 1.0 <= sweep.spend <= 1.0 + sweep.price_per_hour * tick.total_seconds() / 3600
    stopping_spend = sweep.spend
    clock.follow_real_time()  # from here the nodes bill for as long as stopping and teardown really take
    while _sweep(c, "bed-capped").state not in (SweepState.completed, SweepState.failed, SweepState.stopped):
        assert time.monotonic() < deadline + 240, f"sweep still {_sweep(c, 'bed-capped').state}"
        runner.tick()
        time.sleep(0.5)
    sweep = _sweep(c, "bed-capped")
    assert sweep.state == SweepState.stopped, sweep.error
    print(f"budget 1.0: spend {stopping_spend:.4f} when stopping began, {sweep.spend:.4f} after teardown")

    runs = grid_runs(c.database_url, sweep.grid_id)
    assert {r.state for r in runs} <= set(TERMINAL_STATES) and RunState.completed not in {r.state for r in runs}
    trained = [r for r in runs if r.best_step is not None]
    assert trained  # arms that ran stopped gracefully, each keeping its best checkpoint, copied home
    for run in trained:
        assert (Path(sweep.results_dir) / "runs" / f"{run.id}-{run.arm}" / "best.pt").is_file()
    _assert_torn_down(c)
