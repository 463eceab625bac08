"""A run's in-training evaluation (runs/in_training.py) stored as an evaluation job's result, or, where none can
be, the run's events saying why (an evaluation job then scores the run: the decider's catch-up). The launcher
calls `stored_in_training` with each reply's new records (runs/launcher.py), after storing them (runs/ingest.py).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from model.spec import ArmSpec
from orchestrator.db.events import record_event
from orchestrator.db.models import Evaluation, EvaluationResult, Run
from orchestrator.grids.evaluations import EVERY_METRIC, IN_TRAINING, ran_in_training
from orchestrator.runs.evaluation_jobs import settle, store_record
from orchestrator.runs.evaluation_record import refused_rows
from orchestrator.runs.in_training import FAILED_KIND, FINAL_STEP, end_evaluation_of, split_off
from orchestrator.runs.ingest import refused_metrics
from orchestrator.vocabulary import EvaluationState
from worker.protocol import IN_TRAINING_ERROR, IN_TRAINING_RECORD, CheckpointRecord, EndEvaluation, first_error
from worker.worker_names import worker_name


def stored_in_training(session: Session, run: Run, records: list[dict[str, Any]], new: list[int]) -> None:
    """Store the in-training evaluation each new final record among a reply's `records` carries (`new`: the
    steps ingest stored; it stores none of the evaluation: split_off)."""
    records, said = split_off(records)
    for record in records:
        if record.get("final") is True and int(record["step"]) in new:
            try:
                store_in_training(session, run, record, said.get(int(record["step"]), {}))
            except (ValueError, TypeError, KeyError) as exc:  # a node's odd value: the run's records stand
                _fallback(session, run, f"it could not be read: {type(exc).__name__}: {str(exc)[:500]}")


def _fallback(session: Session, run: Run, why: str) -> None:
    record_event(session, run, FAILED_KIND, f"not evaluated inside its training job: {why}; an evaluation job "
                                            "scores it before the grid's look", reason=why[:2000])  # fmt: skip


def _evaluation_for(session: Session, run: Run, asked: EndEvaluation, measures: list[str]) -> Evaluation:
    """The grid's in-training evaluation of these images and measures (every job of it scored in training),
    created with the first run scored."""
    candidates = session.scalars(select(Evaluation).where(
        Evaluation.grid_id == run.grid_id, Evaluation.images == asked.images, Evaluation.step == FINAL_STEP,
    ).order_by(Evaluation.id))  # fmt: skip
    for evaluation in candidates:
        jobs = evaluation.results
        if jobs and all(ran_in_training(j) for j in jobs) and list(evaluation.measures or []) == measures:
            return evaluation
    evaluation = Evaluation(grid_id=run.grid_id, images=asked.images, step=FINAL_STEP, measures=measures,
                            state=EvaluationState.running)  # fmt: skip
    session.add(evaluation)
    session.flush()
    return evaluation


def store_in_training(session: Session, run: Run, record: dict[str, Any], said: dict[str, Any]) -> bool:
    """Store the in-training evaluation sent with the run's new final `record` (`said`: split_off's) as a
    completed job of the grid's in-training evaluation; True where stored. Where one was asked and none can be
    stored, the run's events say why (an evaluation job scores it instead). Only at the run's last step: a run
    stopped early is evaluated by a job, as before."""
    asked = end_evaluation_of(run)
    if asked is None or record.get("final") is not True:
        return False
    if record.get("step") != ArmSpec.model_validate(run.spec).schedule.steps:
        return False
    payload = said.get(IN_TRAINING_RECORD)
    if not isinstance(payload, dict):
        why = said.get(IN_TRAINING_ERROR)
        _fallback(session, run, f"it failed: {str(why)[:1500]}" if why else
                  "its training job sent none (a trainer or node without it)")  # fmt: skip
        return False
    measures = [m for m in EVERY_METRIC if m in (asked.measures or EVERY_METRIC)]
    try:
        values = CheckpointRecord.model_validate(payload).values()
    except ValidationError as exc:
        _fallback(session, run, f"its record was refused: {first_error(exc)}")
        return False
    refused = None if values.get("step") == record["step"] else f"a record of step {values.get('step')}"
    refused = refused or refused_metrics([values]) or refused_rows(values, asked.images, run.fallbacks,
                                                                   tuple(measures))  # fmt: skip
    if refused is not None:
        _fallback(session, run, f"its record was refused: {refused}")
        return False
    evaluation = _evaluation_for(session, run, asked, measures)
    job = EvaluationResult(evaluation=evaluation, run=run, step=int(record["step"]), node=run.node,
                           attempt=run.retries, state=EvaluationState.running,
                           started_at=run.started_at or run.created_at)  # fmt: skip
    session.add(job)
    store_record(job, values, worker_name(run.id, run.retries))  # as an evaluation job's result is stored
    job.extra = {**(job.extra or {}), IN_TRAINING: True}
    session.flush()
    settle(evaluation)
    return True
