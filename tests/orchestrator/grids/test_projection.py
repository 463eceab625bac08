"""Projected cost from the product's own records: an arm key's steady-state rate on one GPU model, the
scaling a 2-GPU twin implies, the FLOP estimate where nothing was measured, and the plan saying which."""

from __future__ import annotations

import pytest

from model.spec import ArmSpec
from orchestrator.db.events import record_event
from orchestrator.db.models import Grid, Metric, Run
from orchestrator.db.session import session_scope
from orchestrator.grids.projection import ESTIMATED, MEASURED, arm_key, measured_rates, project
from orchestrator.grids.replicates import projected_gpu_hours
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.runs.run_end import GROWN
from orchestrator.vocabulary import RunState

H100 = "NVIDIA H100 80GB HBM3"
TINY = {"model": {"size": "tiny"}, "schedule": {"batch_size": 8, "steps": 3600}}


def a_spec(**changes: object) -> ArmSpec:
    body = ArmSpec().model_dump(mode="json")
    body["model"]["size"] = "tiny"
    body["schedule"].update(batch_size=8, steps=3600)
    for key, value in changes.items():
        body[key] = value
    return ArmSpec.model_validate(body)


def store_run(  # type: ignore[no-untyped-def]
    session, spec: ArmSpec, gpu: str, rates: list[float], ranks: list[int] | None = None
) -> Run:
    grid = Grid(name="past", control_arm="A", overrides={}, seeds=1)
    run = Run(position=0, arm="A", spec=spec.model_dump(mode="json"), state=RunState.completed, gpu_name=gpu)
    run.metrics = [Metric(step=10 * (i + 1), iter_per_sec=r, extra={"ranks": ranks[i]} if ranks else {})
                   for i, r in enumerate(rates)]
    grid.runs = [run]
    session.add(grid)
    return run


def test_the_arm_key_ignores_seed_steps_gpus_and_detector_but_not_the_model() -> None:
    a = a_spec()
    same = a.model_copy(update={"gpus": 2, "data": a.data.model_copy(update={"seed": 5}),
                                "schedule": a.schedule.model_copy(update={"steps": 10})})
    assert arm_key(same) == arm_key(a)
    assert arm_key(a_spec(model={"size": "small"})) != arm_key(a)


def test_measured_rates_beat_the_estimate_and_a_twin_gives_the_scaling(database_url: str) -> None:
    a = a_spec()
    with session_scope(database_url) as session:
        assert project(a, measured_rates(session, H100)).source == ESTIMATED  # nothing measured yet
        store_run(session, a, H100, [0.2, 2.0, 2.0, 2.1])  # the first record carries the compile
        store_run(session, a.model_copy(update={"gpus": 2}), H100, [0.3, 4.0, 4.0])
        store_run(session, a, "NVIDIA A100-SXM4-80GB", [9.0, 9.0])  # another GPU model: not ours
    with session_scope(database_url) as session:
        rates = measured_rates(session, H100)
        assert rates.scaling() == {2: pytest.approx(2.0)}
        projection = project(a, rates)
        assert projection.source == MEASURED
        assert projection.hours == pytest.approx(3600 / 2.0 / 3600)  # 3600 steps at 2 steps/s
        other = a_spec(model={"size": "small"})
        assert project(other, rates).hours == pytest.approx(projected_gpu_hours(other))
        assert project(other, rates).source == ESTIMATED

        grid = create_grid(session, GridCreate(name="g", arms=["A", "B"], overrides=TINY, gpus_per_arm="auto"),
                           nodes={"quad": 4})
        assert grid.plan is not None
        assert grid.plan["sources"] == {"A": MEASURED, "B": ESTIMATED}
        assert grid.plan["scaling"] == {"2": pytest.approx(2.0)}
        assert grid.plan["scaling_source"] == MEASURED
        assert grid.plan["gpu_model"] == H100  # the GPU model most runs recorded


def test_only_the_named_gpu_models_rates_count(database_url: str) -> None:
    with session_scope(database_url) as session:
        rates = measured_rates(session, "NVIDIA A100-SXM4-80GB")
        assert rates.scaling() == {}
        assert rates.steps_per_s == {(arm_key(a_spec()), 1): 9.0}


def test_the_fixed_cost_is_measured_from_a_run_s_wall_time_with_its_evaluations_split_out(database_url: str) -> None:
    """A run of 40 steps at 2 steps/s that took 80 s to its last record with 4 evaluations of 5 s each
    spent 80 - 20 - 20 = 40 s starting; a planned run of 3600 steps (checkpoint_every 500: 8 evaluations)
    then costs 40 + 8 x 5 = 80 s fixed. A resumed run (its wall clock restarted) is not read."""
    a = a_spec()
    with session_scope(database_url) as session:
        run = store_run(session, a, H100, [2.0, 2.0, 2.0, 2.0])
        for i, metric in enumerate(run.metrics):
            metric.wall_time_s = 20.0 * (i + 1) if i < 3 else 80.0
            metric.extra = {"eval_time_s": 5.0}
        resumed = store_run(session, a, H100, [2.0, 2.0])
        for metric in resumed.metrics:
            metric.wall_time_s, metric.extra = 1.0, {"eval_time_s": 50.0, "resumed_from_step": 10}
    with session_scope(database_url) as session:
        rates = measured_rates(session, H100)
    projection = project(a, rates)
    assert projection.fixed_source == MEASURED
    assert projection.fixed_hours * 3600 == pytest.approx(40 + 8 * 5)
    estimated = project(a_spec(model={"size": "small"}), rates)
    assert estimated.fixed_source == ESTIMATED
    assert estimated.fixed_hours > 0


def test_a_grown_runs_rates_count_at_the_gpus_each_record_ran_on(database_url: str) -> None:
    """A run grown from 1 GPU to 2 (runs/grow.py): its spec says 2, its records say which count each ran on."""
    a = a_spec(model={"size": "small"})
    with session_scope(database_url) as session:
        grown = a.model_copy(update={"gpus": 2})
        run = store_run(session, grown, "grown GPU", [0.2, 1.0, 1.0, 0.3, 2.0, 2.0], ranks=[1, 1, 1, 2, 2, 2])
        session.flush()  # the growth's event, as runs/grow.py records it: the controller's count, not the records'
        record_event(session, run, GROWN, "grown from 1 to 2 GPUs at step 30", step=30, from_gpus=1, to_gpus=2)
    with session_scope(database_url) as session:
        rates = measured_rates(session, "grown GPU")
        assert rates.steps_per_s == {(arm_key(a), 1): 1.0, (arm_key(a), 2): 2.0}  # each count's first left out
        assert rates.scaling() == {2: pytest.approx(2.0)}
