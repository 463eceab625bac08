"""A deciding grid's runs are evaluated inside their training jobs (issue 62): each run's worker, built from the
args the launcher gives it (runs/placement.py worker_args), evaluates its last checkpoint on the split's images
before it ends, with the model loaded, and the controller stores that as an evaluation job's result; the first
look finds the runs measured and queues no evaluation. Where a run's in-training evaluation fails, its events
say so and the decider's catch-up evaluates that run alone with a job.

Tiny 2-arm grids trained on the CPU in this process through the real worker (worker/actor.py
ArmWorker, no Ray) and its replies validated as the launcher validates them.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from model.spec import ArmSpec
from orchestrator.db.models import DecisionLook, Evaluation, EvaluationResult, Event, Grid, Metric, Run, utcnow
from orchestrator.db.session import session_scope
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.results.deciding.decider import decide_due_grids, look_state
from orchestrator.results.deciding.plan_look import NOT_JUDGED
from orchestrator.runs.in_training import FAILED_KIND, end_evaluation_of
from orchestrator.runs.in_training_store import stored_in_training
from orchestrator.runs.ingest import ingest
from orchestrator.runs.placement import run_dir, worker_args
from orchestrator.settings import Settings
from tests.kit.settings import tiny_overrides
from worker.actor import ArmWorker
from worker.evaluation import evaluate_arm
from worker.protocol import IN_TRAINING_RECORD, EndEvaluation, WorkerReply, jsonable

HELD_OUT, TRAINED_ON, STEPS = 16, 4, 3


def _train(settings: Settings, grid_id: int, broken: int | None = None) -> None:
    """Train every run through its worker as the launcher would start it, and store its replies' records;
    `broken`: a run whose in-training evaluation is asked for more images than the split holds (it fails)."""
    with session_scope(settings.database_url) as session:
        for run in session.scalars(select(Run).where(Run.grid_id == grid_id).order_by(Run.id)):
            out = run_dir(settings, run.id)
            args = worker_args(settings, run, out, "worker.train:train_arm", None)
            args.storage = None  # no run storage here: the run's folder alone
            if run.id == broken:
                args.end_evaluation = EndEvaluation(images=HELD_OUT * 100, measures=["val_flow_loss"])
            run.node, run.nodes, run.started_at = "local", ["local"], utcnow()  # as mark_running records it
            worker = ArmWorker(**dict(args))
            while (reply := WorkerReply.model_validate(jsonable(worker.poll(None, wait_s=0.5)))).state == "running":
                time.sleep(0.05)
            assert reply.state == "done", reply.error
            records = [r.values() for r in reply.records]  # stored as the launcher stores them (_collect)
            stored_in_training(session, run, records, ingest(session, run, records, detect=False))
            run.checkpoint_dir, run.state, run.finished_at = str(out), "completed", utcnow()


def _grid(settings: Settings, name: str, seeds: int = 2) -> int:
    overrides = tiny_overrides(STEPS, checkpoint_every=STEPS, warmup_steps=1)
    overrides["data"]["held_out"], overrides["eval"]["num_samples"] = HELD_OUT, TRAINED_ON
    decide = {"min_seeds": seeds, "max_seeds": 3, "margin": {"val_flow_ivw": 0.0}}
    with session_scope(settings.database_url) as session:
        return create_grid(session, GridCreate(name=name, arms=["A", "B"], overrides=overrides, decide=decide)).id


@pytest.fixture(scope="module")
def grid(settings: Settings) -> int:
    grid_id = _grid(settings, "in-training")
    _train(settings, grid_id)
    return grid_id


def test_a_deciding_grids_run_is_asked_for_the_split_measuring_what_the_grid_decides_on(
    settings: Settings, grid: int
) -> None:
    with session_scope(settings.database_url) as session:
        run = session.get(Grid, grid).runs[0]
        args = worker_args(settings, run, run_dir(settings, run.id), "worker.train:train_arm", None)
        assert args.end_evaluation == EndEvaluation(images=HELD_OUT, measures=["val_flow_loss"])
        assert end_evaluation_of(Run(spec={**run.spec}, grid=Grid(name="fixed"))) is None  # no decide: none


def test_the_training_job_stores_its_evaluation_as_an_evaluation_jobs_result(
    settings: Settings, grid: int, client: TestClient, tmp_path: Path
) -> None:
    with session_scope(settings.database_url) as session:
        [evaluation] = session.scalars(select(Evaluation).where(Evaluation.grid_id == grid)).all()
        assert (evaluation.state, evaluation.images, evaluation.step) == ("completed", HELD_OUT, "final")
        assert evaluation.measures == ["val_flow_loss"]  # the grid decides on the flow loss: no LPIPS sampling
        jobs = list(evaluation.results)
        assert len(jobs) == 4 and all(j.state == "completed" and j.extra["in_training"] for j in jobs)
        for job in jobs:
            assert (job.step, job.node, job.val_flow_loss_n) == (STEPS, "local", HELD_OUT)
            assert job.recon_lpips is None and job.gpu_seconds is not None and job.gpu_seconds >= 0
            final = session.scalars(select(Metric).where(Metric.run_id == job.run_id, Metric.step == STEPS)).one()
            assert IN_TRAINING_RECORD not in final.extra  # a job's result, not part of the training record
            assert job.extra["val_flow_loss_samples"][:TRAINED_ON] == pytest.approx(
                final.extra["val_flow_loss_samples"], rel=1e-4)  # the same images and noise as training's
        # The evaluation job's own scoring of the same checkpoint, loaded again: the same values.
        run = jobs[0].run
        [again] = evaluate_arm(ArmSpec.model_validate(run.spec), tmp_path, evaluation={
            "step": STEPS, "source_dir": run.checkpoint_dir, "images": HELD_OUT, "measures": ["val_flow_loss"]})
        assert jobs[0].extra["val_flow_loss_samples"] == pytest.approx(again["val_flow_loss_samples"], rel=1e-5)
    view = client.get(f"/api/grids/{grid}/evaluations/{evaluation.id}").json()
    assert view["in_training"] is True and all(r["in_training"] for r in view["runs"])
    assert client.get(f"/api/grids/{grid}/report.json").json()["evaluation"]["in_training"] == 4
    assert client.get(f"/api/dashboard/grids/{grid}").json()["evaluation"]["in_training"] == 4  # said there


def test_the_first_look_finds_the_runs_measured_and_queues_no_evaluation(settings: Settings, grid: int) -> None:
    with session_scope(settings.database_url) as session:
        state = look_state(session, session.get(Grid, grid))
        assert state.images_asked == HELD_OUT and {r.n for r in state.readings} == {HELD_OUT}
    assert decide_due_grids(settings) == [grid]
    with session_scope(settings.database_url) as session:
        [look] = session.scalars(select(DecisionLook).where(DecisionLook.grid_id == grid)).all()
        assert not any(a["action"] == "images" for a in look.actions), look.actions
        assert not any(c["reason"].startswith(NOT_JUDGED) for c in look.comparisons)  # judged at once
        assert len(session.scalars(select(Evaluation).where(Evaluation.grid_id == grid)).all()) == 1
        new = [r for r in session.get(Grid, grid).runs if r.state == "queued"]
        for run in new:  # a seed the look added is evaluated in its training too, on the same images
            assert end_evaluation_of(run) == EndEvaluation(images=HELD_OUT, measures=["val_flow_loss"])


def test_a_failed_in_training_evaluation_is_said_and_a_job_evaluates_that_run_alone(settings: Settings) -> None:
    grid_id = _grid(settings, "in-training-fails", seeds=1)
    with session_scope(settings.database_url) as session:
        broken = max(r.id for r in session.get(Grid, grid_id).runs)
    _train(settings, grid_id, broken=broken)
    with session_scope(settings.database_url) as session:
        [said] = session.scalars(select(Event).where(Event.run_id == broken, Event.kind == FAILED_KIND)).all()
        assert "it failed" in said.message and "an evaluation job scores it" in said.message
        rows = session.scalars(select(EvaluationResult).join(Evaluation).where(Evaluation.grid_id == grid_id)).all()
        assert sorted(r.run_id for r in rows) == sorted(r.id for r in session.get(Grid, grid_id).runs
                                                        if r.id != broken)  # fmt: skip
    assert decide_due_grids(settings) == []  # the catch-up first: no look yet
    with session_scope(settings.database_url) as session:
        catch_up = session.scalars(select(Evaluation).where(Evaluation.grid_id == grid_id,
                                                            Evaluation.state == "queued")).one()  # fmt: skip
        assert catch_up.images == HELD_OUT and catch_up.measures == ["val_flow_loss"]
        assert [j.run_id for j in catch_up.results] == [broken]
