"""The night plan redrawn as the night goes, with logical GPUs and a fake clock: the launcher's own choice
(`Replanner.redraw`, `Redraws.node_for`) over a real database, with each run's worker standing in as
its projected hours on the clock. A run stopped early frees its GPUs to the queue and the plan is
redrawn; a node that leaves mid-plan loses no run; a night played to the end lasts what the plan said."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Event, Grid, Run, aware
from orchestrator.db.session import session_scope
from orchestrator.grids.planner import speedup
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.runs.replan import Held, Replanner
from orchestrator.vocabulary import RunState
from tests.kit.clock import FakeClock

TINY = {"model": {"size": "tiny"}, "schedule": {"batch_size": 8}}
# The quad night as measured (arm A 6.66 h on one H100; B, C, D 3.18 h; A on 2 GPUs 2.04x, on 4 3.98x).
HOURS = {"A": 6.66, "B": 3.18, "C": 3.18, "D": 3.18}
SCALING = {2: 2.04, 4: 3.98}
START = datetime(2026, 11, 27, 22, 0, tzinfo=UTC)


@dataclass
class Night:
    """The launcher's side of a night: the nodes' logical GPUs, the live workers and the clock."""

    session: Session
    grid_id: int
    nodes: dict[str, int]
    clock: FakeClock = field(default_factory=lambda: FakeClock(START))
    held: dict[int, Held] = field(default_factory=dict)
    replanner: Replanner = field(init=False)

    def __post_init__(self) -> None:
        self.replanner = Replanner(self.clock)

    def runs(self) -> list[Run]:
        return list(self.session.scalars(select(Run).where(Run.grid_id == self.grid_id).order_by(Run.position)))

    def launch_pass(self) -> list[Run]:
        """What `Launcher._launch_queued` does, a worker being a run marked running on its node."""
        free = {n: g - sum(h.gpus for h in self.held.values() if h.node == n) for n, g in self.nodes.items()}
        queued = [r for r in self.runs() if r.state == RunState.queued]
        plans = self.replanner.redraw(self.session, queued, self.nodes, self.held)
        started = []
        for run in queued:
            node = plans.node_for(run, free)
            if node is None:
                continue
            gpus = run.spec["gpus"]
            free[node] -= gpus
            run.state, run.started_at, run.node = RunState.running, self.clock(), node
            self.held[run.id] = Held(node, gpus)
            started.append(run)
        self.session.flush()
        return started

    def end_of(self, run: Run) -> datetime:
        return aware(run.started_at) + timedelta(hours=HOURS[run.arm] / speedup(self.held[run.id].gpus, SCALING))

    def finish(self, run: Run, state: RunState = RunState.completed) -> None:
        run.state, run.finished_at = state, self.clock()
        del self.held[run.id]

    def play_to_the_end(self) -> float:
        """Advance the clock to each next projected end, finish those runs, launch; the night in hours."""
        self.launch_pass()
        while self.held:
            live = [r for r in self.runs() if r.id in self.held]
            self.clock.now = min(self.end_of(r) for r in live)
            for run in live:
                if self.end_of(run) <= self.clock.now:
                    self.finish(run)
            self.launch_pass()
        assert all(r.state == RunState.completed for r in self.runs())
        return (self.clock.now - START).total_seconds() / 3600

    def plan(self) -> dict:  # type: ignore[type-arg]
        grid = self.session.get(Grid, self.grid_id)
        assert grid is not None and grid.plan is not None
        return grid.plan


def replanned(night: Night) -> list[Event]:
    return list(night.session.scalars(
        select(Event).where(Event.grid_id == night.grid_id, Event.kind == "grid.replanned")
    ))


@pytest.fixture
def night_factory(database_url: str) -> Iterator:  # type: ignore[type-arg]
    with session_scope(database_url) as session:

        def make(seeds: int, nodes: dict[str, int]) -> Night:
            body = GridCreate(name="quad", arms=["A", "B", "C", "D"], overrides=TINY, seeds=seeds, gpus_per_arm="auto")
            grid = create_grid(session, body, nodes=nodes)
            # the measured hours are whole runs: no fixed part on top of them
            grid.plan = {**grid.plan, "hours": HOURS, "fixed_h": {}, "scaling": {str(g): s for g, s in SCALING.items()}}
            session.flush()
            return Night(session, grid.id, nodes)

        yield make


def test_the_quad_night_played_out_lasts_what_the_plan_said(night_factory) -> None:  # type: ignore[no-untyped-def]
    night = night_factory(1, {"quad": 4})
    first = [(r.arm, r.spec["gpus"]) for r in night.launch_pass()]
    projected = night.plan()["night_h"]
    assert projected == pytest.approx(16.2 / 4, rel=0.02)
    assert sum(g for _, g in first) == 4 and len(first) < 4  # one run waits for its slot, on more GPUs
    assert night.launch_pass() == []  # nothing ended: the others wait for their slots
    assert not replanned(night)  # runs starting as planned are no news
    assert night.play_to_the_end() == pytest.approx(projected, rel=1e-3)


def test_a_run_stopped_early_frees_its_gpus_to_the_queue_and_the_plan_is_redrawn(night_factory) -> None:  # type: ignore[no-untyped-def]
    night = night_factory(3, {"quad": 4})
    night.launch_pass()
    before = night.plan()["night_h"]
    # An hour in, the detector stops a one-GPU run (or a two-GPU one: whichever the plan started first).
    night.clock.now = START + timedelta(hours=1)
    victim = min((r for r in night.runs() if r.id in night.held), key=lambda r: night.held[r.id].gpus)
    freed = night.held[victim.id].gpus
    night.finish(victim, RunState.stopped)
    started = night.launch_pass()
    assert started, "the freed GPUs went to no queued run"
    assert sum(night.held[r.id].gpus for r in started) <= freed
    assert sum(h.gpus for h in night.held.values()) == 4  # no GPU idle
    events = replanned(night)
    assert len(events) == 1 and "10 queued, 1 running on 4 GPUs" in events[0].message
    after = night.plan()
    assert after["drawn_at"] is not None
    # the redrawn night counts from the stop, and a run's hours are gone from it
    assert 1 + after["night_h"] < before


def test_a_node_that_leaves_mid_plan_loses_no_run(night_factory) -> None:  # type: ignore[no-untyped-def]
    night = night_factory(3, {"a": 4, "b": 4})
    night.launch_pass()
    night.clock.now = START + timedelta(hours=1)
    on_b = [r for r in night.runs() if r.id in night.held and night.held[r.id].node == "b"]
    assert on_b
    widths = {r.id: night.held[r.id].gpus for r in on_b}
    for run in on_b:  # the launcher's _requeue: back to the queue, to resume from its checkpoint
        run.state, run.retries, run.last_checkpoint_step = RunState.queued, run.retries + 1, 100
        del night.held[run.id]
    night.nodes = {"a": 4}
    night.launch_pass()
    plan = night.plan()
    assert plan["unplanned"] == []
    slotted = {s["run"] for s in plan["slots"]}
    assert {f"{r.arm}#{r.seed}" for r in night.runs() if r.state != RunState.completed} <= slotted
    night.play_to_the_end()  # every run completes on the node that stayed
    for run in on_b:
        assert run.spec["gpus"] == widths[run.id]  # resumed at the world size its checkpoint was written at


def test_a_live_run_with_a_record_is_projected_from_its_own_progress(night_factory) -> None:  # type: ignore[no-untyped-def]
    """On two H200s a run projected 74 s from its end by the plan had 150 s left, and the growth judged on
    it was declined: once a run has a record, its hours left are its own (steps left at that window's rate,
    scaled to the GPUs asked about, and an evaluation per checkpoint left), less the time since the record."""
    from orchestrator.db.models import Metric
    from orchestrator.runs.replan import remaining_hours

    night = night_factory(1, {"quad": 4})
    night.launch_pass()
    run = next(r for r in night.runs() if r.id in night.held)
    run.spec = {**run.spec, "schedule": {**run.spec["schedule"], "steps": 500, "checkpoint_every": 250}}
    gpus = night.held[run.id].gpus
    planned = remaining_hours(run, gpus, night.clock())
    night.session.add(Metric(run_id=run.id, step=250, iter_per_sec=1.25, created_at=night.clock(),
                             extra={"ranks": gpus, "eval_time_s": 20.0}))
    night.session.flush()
    left_s = 250 / 1.25 + 20  # 250 steps at 1.25 it/s, then the last checkpoint's evaluation
    assert remaining_hours(run, gpus, night.clock()) * 3600 == pytest.approx(left_s)
    assert remaining_hours(run, gpus, night.clock()) != pytest.approx(planned)
    on_more = 2 * gpus  # the same steps on twice the GPUs, at the measured scaling
    expected = 250 / (1.25 * speedup(on_more, SCALING) / speedup(gpus, SCALING)) + 20
    assert remaining_hours(run, on_more, night.clock()) * 3600 == pytest.approx(expected)
    night.clock.now = night.clock() + timedelta(seconds=100)
    assert remaining_hours(run, gpus, night.clock()) * 3600 == pytest.approx(left_s - 100)
