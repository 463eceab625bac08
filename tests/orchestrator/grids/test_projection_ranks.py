"""A record's `ranks` is a node's claim, and measured rates are shared by every later grid's projection:
the GPUs a record counts at are the ones the controller gave the run (its spec's, or its count before a
growth the controller recorded), and a record whose claim disagrees is left out of the rates. A real
migrated database; the runs' records as ingest stores them."""

from __future__ import annotations

import pytest

from model.spec import ArmSpec
from orchestrator.db.events import record_event
from orchestrator.db.models import Grid, Metric, Run
from orchestrator.db.session import session_scope
from orchestrator.grids.projection import arm_key, measured_rates, project
from orchestrator.runs.run_end import GROWN
from orchestrator.vocabulary import RunState

GPU = "NVIDIA H200 (ranks test)"


def a_spec(size: str = "tiny", gpus: int = 1, batch: int = 8) -> ArmSpec:
    """A tiny arm; each test its own batch size, so its arm keys are its own in the module's database."""
    body = ArmSpec().model_dump(mode="json")
    body["model"]["size"] = size
    body["schedule"].update(batch_size=batch, steps=3600)
    body["gpus"] = gpus
    return ArmSpec.model_validate(body)


def store_run(session, spec: ArmSpec, rates: list[float], ranks: list[object] | None = None) -> Run:  # type: ignore[no-untyped-def]
    grid = Grid(name="past", control_arm="A", overrides={}, seeds=1)
    run = Run(position=0, arm="A", spec=spec.model_dump(mode="json"), state=RunState.completed, gpu_name=GPU)
    run.metrics = [Metric(step=10 * (i + 1), iter_per_sec=r, extra={"ranks": ranks[i]} if ranks else {})
                   for i, r in enumerate(rates)]
    grid.runs = [run]
    session.add(grid)
    session.flush()
    return run


def test_a_node_claiming_more_ranks_than_it_was_given_skews_no_other_arm_s_projection(database_url: str) -> None:
    """Honest runs of arm A on 1 and on 4 GPUs give the scaling (3.85); a node that ran A on the one GPU
    it was given but claims 4 ranks made it 2.43, and arm B's projection (measured on 4 GPUs only, divided
    by that scaling) 1.6 times too short."""
    a, b = a_spec(), a_spec(size="small", gpus=4)
    with session_scope(database_url) as session:
        store_run(session, a, [0.2, 2.0, 2.0, 2.0])
        store_run(session, a.model_copy(update={"gpus": 4}), [0.3, 7.7, 7.7])
        store_run(session, b, [0.1, 3.8, 3.8])
        honest = project(a_spec(size="small"), measured_rates(session, GPU)).hours
        store_run(session, a, [0.2, 2.0, 2.0, 2.0], ranks=[4, 4, 4, 4])  # one GPU given, four claimed
    with session_scope(database_url) as session:
        rates = measured_rates(session, GPU)
        assert rates.scaling() == {4: pytest.approx(3.85)}
        assert project(a_spec(size="small"), rates).hours == pytest.approx(honest)


def test_a_grown_run_s_records_count_at_the_gpus_of_the_attempt_that_wrote_them(database_url: str) -> None:
    a = a_spec(batch=16)
    with session_scope(database_url) as session:
        run = store_run(session, a.model_copy(update={"gpus": 2}), [0.2, 1.0, 1.0, 0.3, 1.9, 1.9],
                        ranks=[1, 1, 1, 2, 2, 2])  # grown from 1 to 2 GPUs after step 30
        record_event(session, run, GROWN, "grown from 1 to 2 GPUs at step 30", step=30, from_gpus=1, to_gpus=2)
        liar = store_run(session, a.model_copy(update={"gpus": 2}), [0.2, 9.0, 9.0, 0.3, 9.0, 9.0],
                         ranks=[2, 2, 2, 1, 1, 1])  # the counts swapped: the later records claim one GPU
        record_event(session, liar, GROWN, "grown from 1 to 2 GPUs at step 30", step=30, from_gpus=1, to_gpus=2)
    with session_scope(database_url) as session:
        rates = measured_rates(session, GPU)
        assert rates.steps_per_s[(arm_key(a), 1)] == pytest.approx(1.0)
        assert rates.steps_per_s[(arm_key(a), 2)] == pytest.approx(1.9)


@pytest.mark.parametrize("claim", [4.5, 10**20, "4", -1, True])
def test_a_ranks_claim_that_is_no_gpu_count_is_left_out_not_an_error(database_url: str, claim: object) -> None:
    """On Postgres the claim was cast to an integer in SQL: "4.5" or 1e20 failed every later grid's plan."""
    a = a_spec(batch=32)
    with session_scope(database_url) as session:
        store_run(session, a, [0.2, 2.0, 2.0], ranks=[claim, claim, claim])
        store_run(session, a, [0.2, 1.0, 1.0])
    with session_scope(database_url) as session:
        assert measured_rates(session, GPU).steps_per_s[(arm_key(a), 1)] == pytest.approx(1.0)


@pytest.mark.parametrize("field", ["eval_time_s", "resumed_from_step"])
def test_another_claim_of_the_wrong_type_is_read_as_none_not_cast(database_url: str, field: str) -> None:
    a = a_spec(batch=64)
    with session_scope(database_url) as session:
        run = store_run(session, a, [0.2, 3.0, 3.0])
        for metric in run.metrics:
            metric.extra = {field: "4.5x"}
    with session_scope(database_url) as session:
        assert measured_rates(session, GPU).steps_per_s[(arm_key(a), 1)] == pytest.approx(3.0)
