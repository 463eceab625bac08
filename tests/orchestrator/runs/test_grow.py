"""Growing a running arm onto freed GPUs: the rule (`grow_choice`, pure: a night in hours) and the
controller's side of it over a real database (`Grower`: which runs may grow, the stop asked for it, the
run queued again at its new count on its node). The growth through the launcher and real ranks:
tests/orchestrator/runs/test_launcher.py; the resume at the larger world size: tests/worker/test_ranks.py."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from orchestrator.db.models import Event, Run
from orchestrator.db.session import session_scope
from orchestrator.grids.planner import PlanRun, speedup
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.runs.grow import ASKED, Grower, LiveArm, grow_choice, growable
from orchestrator.runs.placement import Worker
from orchestrator.runs.run_end import GROWN, requeue_run
from orchestrator.settings import Settings
from orchestrator.vocabulary import RunState
from tests.kit.clock import FakeClock

SCALING = {2: 2.04, 4: 3.98}  # as measured on H100s (issue 48)
RESUME_H = 17 / 3600  # the default grow_resume_s
QUAD = {"quad": 4}


def arm(run_id: int, gpus: int, hours_left: float, choices: tuple[int, ...] = (1, 2, 4), grid: int = 1) -> LiveArm:
    return LiveArm(run_id, grid, "quad", gpus, hours_left, choices)


def test_an_arm_grows_onto_freed_gpus_when_that_shortens_the_night_by_more_than_the_resume() -> None:
    a, b = arm(1, 1, 3.0), arm(2, 1, 0.5)  # C and D ended early: two GPUs free
    growth = grow_choice(a, [a, b], [], QUAD, 2, SCALING, RESUME_H)
    assert growth is not None and (growth.from_gpus, growth.to_gpus) == (1, 2)  # 3 GPUs: its batch says no
    assert growth.night_h == pytest.approx(3.0) and growth.grown_night_h == pytest.approx(3.0 / 2.04)
    growth = grow_choice(a, [a], [], QUAD, 3, SCALING, RESUME_H)  # B ended too
    assert growth is not None and growth.to_gpus == 4 and growth.grown_night_h == pytest.approx(3.0 / 3.98)


def test_an_arm_does_not_grow_when_the_night_gains_less_than_the_resume_costs() -> None:
    a = arm(1, 1, 20 / 3600)  # 20 s left: on two GPUs about 10 s, less than the 17 s restart saves
    assert grow_choice(a, [a], [], QUAD, 3, SCALING, RESUME_H) is None
    assert grow_choice(a, [a], [], QUAD, 3, SCALING, 5 / 3600) is not None  # a 5 s restart would pay


def test_an_arm_does_not_grow_when_another_run_or_the_queue_holds_the_night() -> None:
    a = arm(1, 1, 3.0)
    assert grow_choice(a, [a, arm(2, 1, 5.0)], [], QUAD, 2, SCALING, RESUME_H) is None  # B ends last anyway
    # an arm of another grid does not hold this grid's night: A grows beside it
    assert grow_choice(a, [a, arm(2, 1, 5.0, grid=2)], [], QUAD, 2, SCALING, RESUME_H) is not None
    # two queued one-GPU runs of 3 h take the two free GPUs now; A on two would make one of them wait
    queued = [PlanRun("C", 3.0), PlanRun("D", 3.0)]
    assert grow_choice(a, [a], queued, QUAD, 2, SCALING, RESUME_H) is None


def test_an_arm_of_explicit_gpus_or_not_dividing_its_batch_does_not_grow() -> None:
    fixed = arm(1, 1, 3.0, choices=())
    assert grow_choice(fixed, [fixed], [], QUAD, 3, SCALING, RESUME_H) is None
    odd = arm(1, 1, 3.0, choices=(1,))  # a batch of 3: one GPU only
    assert grow_choice(odd, [odd], [], QUAD, 3, SCALING, RESUME_H) is None


# -- the controller's side, over a real database ------------------------------------------------------


@dataclass
class Node:
    gpus: int


TINY = {"model": {"size": "tiny"}, "schedule": {"batch_size": 8, "steps": 100, "checkpoint_every": 10}}
START = datetime(2026, 11, 27, 22, 0, tzinfo=UTC)


def test_growable_runs_are_running_auto_runs_whose_count_the_plan_chooses(database_url: str) -> None:
    with session_scope(database_url) as session:
        arms = [{"parent": "A", "name": "P", "gpus": 1}, {"parent": "A", "name": "Q"}]
        grid = create_grid(session, GridCreate(name="g1", arms=arms, overrides=TINY, gpus_per_arm="auto"),
                           nodes=QUAD)
        plain = create_grid(session, GridCreate(name="g2", arms=["A"], overrides=TINY), nodes=QUAD)
        p, q = grid.runs
        for run in (p, q, *plain.runs):
            run.state = RunState.running
        assert growable(q, 4) == (1, 2, 4) and growable(q, 2) == (1, 2)
        assert growable(p, 4) == ()  # `gpus: 1` named: kept as given
        assert growable(plain.runs[0], 4) == ()  # not an auto grid
        q.stop_requested = True
        assert growable(q, 4) == ()  # being stopped


def test_the_grower_stops_the_arm_for_its_growth_and_queues_it_again_on_its_node(
    database_url: str, tmp_path: Path
) -> None:
    settings = Settings(database_url=database_url, home_dir=tmp_path, max_retries=1)
    clock = FakeClock(START)
    with session_scope(database_url) as session:
        arms = [{"parent": "A", "name": "P", "gpus": 1}, {"parent": "A", "name": "Q"}]
        grid = create_grid(session, GridCreate(name="g3", arms=arms, overrides=TINY, gpus_per_arm="auto"),
                           nodes=QUAD)
        scaling = {str(g): s for g, s in SCALING.items()}
        grid.plan = {**grid.plan, "hours": {"P": 0.5, "Q": 3.0}, "fixed_h": {}, "scaling": scaling}  # whole runs
        p, q = grid.runs
        p.state = RunState.completed  # P ended early
        q.state, q.spec, q.started_at, q.last_checkpoint_step = RunState.running, {**q.spec, "gpus": 1}, START, 10
        q_id = q.id
    worker = Worker(q_id, "ablate-run-q-0", "quad", 10, started=True, gpus=1)
    stops: list[Worker] = []
    grower = Grower(settings, lambda: {"quad": Node(4)}, clock)
    (growth,) = grower.offer({q_id: worker}, {"quad": 3}, stops.append)
    assert (growth.from_gpus, growth.to_gpus) == (1, 4) and stops == [worker]
    assert growth.grown_night_h == pytest.approx(3.0 / speedup(4, SCALING))
    assert worker.gpus == 4  # the freed GPUs are its own until it resumes
    worker.stop_sent = True
    assert grower.offer({q_id: worker}, {"quad": 0}, stops.append) == [] and len(stops) == 1
    # A controller that restarted before the stop went out adopts the worker at its grown count, unstopped:
    adopted = Worker(q_id, "ablate-run-q-0", "quad", 10, started=True, gpus=4)
    assert Grower(settings, lambda: {"quad": Node(4)}, clock).offer({q_id: adopted}, {"quad": 0}, stops.append) == []
    assert stops == [worker, adopted]  # its stop is sent again
    with session_scope(database_url) as session:
        run = session.get(Run, q_id)
        assert run is not None and run.spec["gpus"] == 4
        asked = grower.asked(session, run)
        assert asked is not None and (asked["from_gpus"], asked["to_gpus"], asked["step"]) == (1, 4, 10)
        run.last_checkpoint_step = 11  # the stop's checkpoint
        grower.ended(session, run, "quad", asked)
        assert run.state == RunState.queued and run.retries == 1
        (event,) = session.scalars(select(Event).where(Event.run_id == q_id, Event.kind == GROWN)).all()
        assert (event.data["from_gpus"], event.data["to_gpus"], event.data["step"]) == (1, 4, 11)
        assert [e.kind for e in session.scalars(select(Event).where(Event.run_id == q_id))] == [ASKED, GROWN]
        assert grower.first([session.get(Run, p.id), run])[0] is run  # type: ignore[list-item]
        assert grower.node_for(run, {"quad": 4}) == "quad"
        # a growth is not a retry: a worker lost after it is the first of max_retries=1
        requeue_run(session, run, "worker died", settings.max_retries)
        assert run.state == RunState.queued and run.retries == 2


def test_a_stop_asked_by_the_user_meanwhile_wins_over_the_growth(database_url: str, tmp_path: Path) -> None:
    settings = Settings(database_url=database_url, home_dir=tmp_path)
    with session_scope(database_url) as session:
        grid = create_grid(session, GridCreate(name="g4", arms=[{"parent": "A", "name": "Q"}], overrides=TINY,
                                               gpus_per_arm="auto"), nodes=QUAD)
        grid.plan = {**grid.plan, "hours": {"Q": 3.0}}
        (q,) = grid.runs
        q.state, q.spec, q.started_at = RunState.running, {**q.spec, "gpus": 1}, START
        q_id = q.id
    worker = Worker(q_id, "ablate-run-q-0", "quad", None, started=True, gpus=1)
    grower = Grower(settings, lambda: {"quad": Node(4)}, FakeClock(START))
    assert grower.offer({q_id: worker}, {"quad": 3}, lambda w: None)
    with session_scope(database_url) as session:
        run = session.get(Run, q_id)
        assert run is not None and grower.asked(session, run) is not None
        run.stop_requested = True
        assert grower.asked(session, run) is None  # the launcher then finishes it as stopped


def test_of_two_arms_that_would_grow_on_one_node_the_one_that_gains_most_does(
    database_url: str, tmp_path: Path
) -> None:
    settings = Settings(database_url=database_url, home_dir=tmp_path)
    workers = {}
    with session_scope(database_url) as session:
        for name, hours in (("short", 1.0), ("long", 3.0)):  # two grids: each arm holds its own night
            grid = create_grid(session, GridCreate(name=name, arms=[{"parent": "A", "name": "Q"}], overrides=TINY,
                                                   gpus_per_arm="auto"), nodes=QUAD)
            grid.plan = {**grid.plan, "hours": {"Q": hours}, "scaling": {str(g): s for g, s in SCALING.items()}}
            (q,) = grid.runs
            q.state, q.spec, q.started_at = RunState.running, {**q.spec, "gpus": 1}, START
            session.flush()
            workers[name] = Worker(q.id, f"ablate-run-{name}-0", "quad", None, started=True, gpus=1)
    stops: list[Worker] = []
    grower = Grower(settings, lambda: {"quad": Node(4)}, FakeClock(START))
    by_id = {w.run_id: w for w in workers.values()}
    (growth,) = grower.offer(by_id, {"quad": 1}, stops.append)  # one GPU free: 3 h -> 1.47 h beats 1 h -> 0.49 h
    assert growth.run_id == workers["long"].run_id and growth.to_gpus == 2 and stops == [workers["long"]]
    assert workers["short"].gpus == 1
