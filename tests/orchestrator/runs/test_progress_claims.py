"""A run's progress claim (its records' iterations per second) moves only its own projection, and only
within bounds of what its plan expects (issue 57): over a real database with a fake clock, the launcher's
own re-planning (`Replanner.redraw`) and growth (`Grower.offer`).

One in-range record of 1e-6 it/s made its run 194,000 h from its end, and the grid's night is the longest
of its live runs, so no other arm grew onto freed GPUs; at 1e-310 the hours were infinite, `night_h: inf`
was stored in the grid's plan and the growth's comparison was NaN."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from orchestrator.db.models import Event, Grid, Metric, Run
from orchestrator.db.session import session_scope
from orchestrator.grids.planner import speedup
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.runs.grow import Grower
from orchestrator.runs.placement import Worker
from orchestrator.runs.replan import CLAIM_BOUNDED, CLAIM_REFUSED, Held, Replanner, remaining_hours
from orchestrator.settings import Settings
from orchestrator.vocabulary import RunState
from tests.kit.clock import FakeClock

SCALING = {2: 2.04, 4: 3.98}
TINY = {"model": {"size": "tiny"}, "schedule": {"batch_size": 8, "steps": 100, "checkpoint_every": 10}}
START = datetime(2026, 11, 27, 22, 0, tzinfo=UTC)
QUAD = {"quad": 4}


@dataclass
class Node:
    gpus: int


def quad_grid(session, name: str, hours: dict[str, float], source: str = "measured") -> Grid:  # type: ignore[no-untyped-def]
    """An auto grid of P (`gpus: 1`, kept as given) and Q (the plan's to size) on one 4-GPU node, with
    hours per run as measured (source "measured": a claim may be 10x off them) and no fixed part."""
    arms = [{"parent": "A", "name": "P", "gpus": 1}, {"parent": "A", "name": "Q"}]
    grid = create_grid(session, GridCreate(name=name, arms=arms, overrides=TINY, gpus_per_arm="auto"), nodes=QUAD)
    grid.plan = {**grid.plan, "hours": hours, "fixed_h": {}, "sources": dict.fromkeys(hours, source),
                 "scaling": {str(g): s for g, s in SCALING.items()}}  # fmt: skip
    return grid


def running(run: Run, rate: float | None) -> None:
    """The run started at START on one GPU; with `rate`, its record at step 10 claims that many it/s."""
    run.state, run.spec, run.started_at, run.node = RunState.running, {**run.spec, "gpus": 1}, START, "quad"
    if rate is not None:
        run.metrics.append(Metric(step=10, iter_per_sec=rate, created_at=START, extra={"ranks": 1}))


@pytest.mark.parametrize("rate", [1e-6, 1e-310, 1e9])
def test_a_rate_out_of_bounds_leaves_the_plans_projection_and_says_so_once(database_url: str, rate: float) -> None:
    with session_scope(database_url) as session:
        grid = quad_grid(session, f"claims {rate}", {"P": 0.5, "Q": 3.0})
        p, _ = grid.runs
        running(p, rate)
        session.flush()
        assert remaining_hours(p, 1, START) == pytest.approx(0.5)  # the plan's: 0.5 h, none of it run yet
        assert remaining_hours(p, 2, START) == pytest.approx(0.5 / speedup(2, SCALING))
        events = session.scalars(select(Event).where(Event.run_id == p.id, Event.kind == CLAIM_REFUSED)).all()
        assert len(events) == 1 and events[0].data == {"step": 10}, events  # two asks, one event
        assert "it/s" in events[0].message and "projected from the plan" in events[0].message


def test_a_rate_within_bounds_projects_its_own_run(database_url: str) -> None:
    """The plan expects P's 100 steps in 0.5 h (0.056 it/s); a record of 3x that is believed."""
    with session_scope(database_url) as session:
        grid = quad_grid(session, "honest", {"P": 0.5, "Q": 3.0})
        p, _ = grid.runs
        expected = 100 / (0.5 * 3600)
        running(p, 3 * expected)
        session.flush()
        assert remaining_hours(p, 1, START) == pytest.approx(90 / (3 * expected) / 3600)
        assert not session.scalars(select(Event).where(Event.run_id == p.id, Event.kind == CLAIM_REFUSED)).all()


def test_a_crawling_claim_does_not_keep_another_arm_from_growing(database_url: str, tmp_path: Path) -> None:
    """Q (3 h) and P (0.5 h) run on one GPU each, two GPUs free: Q grows to two, whatever P's node says
    of P's rate. With P's 1e-6 it/s believed, P held the grid's night for 25,000 h and Q stayed on one."""
    settings = Settings(database_url=database_url, home_dir=tmp_path)
    with session_scope(database_url) as session:
        grid = quad_grid(session, "crawler", {"P": 0.5, "Q": 3.0})
        p, q = grid.runs
        running(p, 1e-6)
        running(q, None)
        session.flush()
        workers = {r.id: Worker(r.id, f"ablate-run-{r.arm}-0", "quad", 10, started=True, gpus=1) for r in (p, q)}
        q_id = q.id
    grower = Grower(settings, lambda: {"quad": Node(4)}, FakeClock(START))
    (growth,) = grower.offer(workers, {"quad": 2}, lambda w: None)
    assert (growth.run_id, growth.from_gpus, growth.to_gpus) == (q_id, 1, 2)
    assert growth.night_h == pytest.approx(3.0) and growth.grown_night_h == pytest.approx(3.0 / speedup(2, SCALING))


def test_a_redrawn_plan_never_stores_an_infinite_night(database_url: str) -> None:
    """P claims 1e-310 it/s while Q waits in the queue: the plan redrawn and stored is finite (it was inf)."""
    with session_scope(database_url) as session:
        grid = quad_grid(session, "inf", {"P": 0.5, "Q": 3.0})
        p, q = grid.runs
        running(p, 1e-310)
        session.flush()
        Replanner(FakeClock(START)).redraw(session, [q], QUAD, {p.id: Held("quad", 1)})
        session.flush()
        plan = json.loads(json.dumps(grid.plan))  # as stored
    # Q on four GPUs once P ends as planned (0.5 h): sooner than on the two free now (1.47 h)
    assert plan["night_h"] == pytest.approx(0.5 + 3.0 / speedup(4, SCALING), abs=1e-3), plan
    assert all(math.isfinite(s["end_h"]) for s in plan["slots"]), plan["slots"]


# Issue 63: a claim inside the span still vetoed growth. P's plan expects 100 steps in 0.5 h (0.056 it/s); its
# node's records arrive as fast as that (step 10 at 180 s, step 20 at 360 s, by the controller's clock) while
# claiming 9x slower (a measured plan's span is 10x) or 90,000x slower (a FLOP estimate's is 1e5x).
EXPECTED = 100 / (0.5 * 3600)
SEEN_AT = START + timedelta(seconds=360)
SEEN_H = 80 * 360 / 20 / 3600  # the 80 steps left at the 20 steps in 360 s the controller saw: 0.4 h


def lying(run: Run, rate: float, arrivals: tuple[int, int] = (180, 360)) -> None:
    """The run placed at START on one GPU; its records of steps 10 and 20 arrive `arrivals` seconds after it
    (by default at the honest pace), each claiming `rate`."""
    running(run, None)
    for step, at in zip((10, 20), arrivals, strict=True):
        run.metrics.append(Metric(step=step, iter_per_sec=rate, created_at=START + timedelta(seconds=at),
                                  extra={"ranks": 1}))


@pytest.mark.parametrize(("source", "slower"), [("measured", 9.0), ("estimated", 9e4)])
def test_a_claim_slower_than_the_pace_seen_does_not_keep_another_arm_from_growing(
    database_url: str, tmp_path: Path, source: str, slower: float
) -> None:
    """Q (3 h, 0.1 h run) may grow onto the two free GPUs: P's hours left are the 0.4 h its records' arrival
    says, not the 3.6 h (or 36,000 h) its claim says, which held the grid's night past Q's on main."""
    settings = Settings(database_url=database_url, home_dir=tmp_path)
    with session_scope(database_url) as session:
        grid = quad_grid(session, f"liar {source}", {"P": 0.5, "Q": 3.0}, source)
        p, q = grid.runs
        lying(p, EXPECTED / slower)
        running(q, None)
        session.flush()
        assert remaining_hours(p, 1, SEEN_AT) == pytest.approx(SEEN_H)
        (bounded,) = session.scalars(select(Event).where(Event.run_id == p.id, Event.kind == CLAIM_BOUNDED)).all()
        assert bounded.data == {"step": 20} and "the pace the controller saw" in bounded.message
        workers = {r.id: Worker(r.id, f"ablate-run-{r.arm}-0", "quad", 10, started=True, gpus=1) for r in (p, q)}
        q_id = q.id
    grower = Grower(settings, lambda: {"quad": Node(4)}, FakeClock(SEEN_AT))
    (growth,) = grower.offer(workers, {"quad": 2}, lambda w: None)
    assert (growth.run_id, growth.from_gpus, growth.to_gpus) == (q_id, 1, 2)
    assert growth.night_h == pytest.approx(2.9) and growth.grown_night_h == pytest.approx(2.9 / speedup(2, SCALING))


@pytest.mark.parametrize(("source", "slower"), [("measured", 9.0), ("estimated", 9e4)])
def test_a_claim_slower_than_the_pace_seen_does_not_redraw_the_plan_around_it(
    database_url: str, source: str, slower: float
) -> None:
    """Q queued: the plan redrawn waits 0.4 h for P's GPU and runs Q on all four (night 1.15 h); P's claim
    believed, Q started now on the two free GPUs and the night was P's claimed end."""
    with session_scope(database_url) as session:
        grid = quad_grid(session, f"replan liar {source}", {"P": 0.5, "Q": 3.0}, source)
        p, q = grid.runs
        lying(p, EXPECTED / slower)
        session.flush()
        redraws = Replanner(FakeClock(SEEN_AT)).redraw(session, [q], QUAD, {p.id: Held("quad", 1)})
        session.flush()
        plan = json.loads(json.dumps(grid.plan))
        assert q.id in redraws.planned and q.id not in redraws.due  # it waits for the four GPUs
    assert plan["night_h"] == pytest.approx(SEEN_H + 3.0 / speedup(4, SCALING), abs=1e-3), plan


def test_a_claim_faster_than_the_pace_seen_stands(database_url: str) -> None:
    """The pace seen counts the attempt's start too, so an honest rate above it projects its run: 3x the
    plan's, its records 60 s apart (as fast as it says) after a 120 s start."""
    at = START + timedelta(seconds=240)
    with session_scope(database_url) as session:
        grid = quad_grid(session, "quick", {"P": 0.5, "Q": 3.0})
        p, _ = grid.runs
        lying(p, 3 * EXPECTED, (180, 240))
        session.flush()
        assert remaining_hours(p, 1, at) == pytest.approx(80 / (3 * EXPECTED) / 3600)
        assert not session.scalars(select(Event).where(Event.run_id == p.id, Event.kind == CLAIM_BOUNDED)).all()


def test_the_pace_seen_counts_only_the_steps_of_the_current_attempt(database_url: str) -> None:
    """Resumed at step 50 (attempt 1 placed an hour after START): its pace is the 10 steps it recorded in the
    180 s since that placement, not step 60 over the time since its first placement."""
    with session_scope(database_url) as session:
        grid = quad_grid(session, "resumed", {"P": 0.5, "Q": 3.0}, "estimated")
        p, _ = grid.runs
        running(p, None)
        p.retries = 1
        placed = START + timedelta(hours=1)
        p.metrics.append(Metric(step=50, iter_per_sec=EXPECTED, created_at=START + timedelta(seconds=900),
                                extra={"ranks": 1}))
        p.metrics.append(Metric(step=60, iter_per_sec=EXPECTED / 9e4, created_at=placed + timedelta(seconds=180),
                                extra={"ranks": 1}))
        session.flush()
        session.add(Event(run_id=p.id, grid_id=grid.id, kind="placed", message="attempt 1 placed",
                          data={"attempt": 1}, time=placed))
        session.flush()
        assert remaining_hours(p, 1, placed + timedelta(seconds=180)) == pytest.approx(40 * 18 / 3600)
