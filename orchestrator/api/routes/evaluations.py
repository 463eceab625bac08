"""A grid's stored checkpoints evaluated again on more held-out images, without retraining:
POST /api/grids/{id}/evaluations, GET /api/grids/{id}/evaluations[/{eid}], DELETE .../{eid} to cancel one."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, status
from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Evaluation, Grid
from orchestrator.grids.evaluations import EvaluationCreate, create_evaluation
from orchestrator.results.evaluations import EvaluationView
from orchestrator.runs.evaluation_jobs import cancel
from orchestrator.web.deps import AUTH_RESPONSES, MAX_ID, AuthDep, SessionDep, get_or_404

router = APIRouter(prefix="/api/grids", tags=["evaluations"])


class EvaluationAccepted(BaseModel):
    id: int
    state: str  # an EvaluationState: queued


@router.post(
    "/{grid_id}/evaluations",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=EvaluationAccepted,
    responses={**AUTH_RESPONSES, 404: {"description": "no such grid"}, 422: {"description": "invalid request"}},
)
def request_evaluation(grid_id: int, body: EvaluationCreate, session: SessionDep, _: AuthDep) -> EvaluationAccepted:
    """Evaluate every built-in run's stored checkpoint ("final", "best" or a step every run keeps) on the
    first `images` held-out images, with the same per-image seeded noise as training's evaluation, as one
    GPU job per run on the nodes; no training step runs. The result is stored beside the training records
    and the grid's report uses the largest completed evaluation. 422 naming `images` past the held-out
    split (and its size), or `step` for a step some run does not keep or a grid with runs still active."""
    grid = get_or_404(session, Grid, grid_id)
    evaluation = create_evaluation(session, grid, body)
    session.commit()  # durable before the 202: the launcher picks the jobs up from the database
    return EvaluationAccepted(id=evaluation.id, state=evaluation.state)


@router.get("/{grid_id}/evaluations", response_model=list[EvaluationView],
            responses={404: {"description": "no such grid"}})  # fmt: skip
def list_evaluations(grid_id: int, session: SessionDep) -> list[EvaluationView]:
    """The grid's evaluations, newest first."""
    get_or_404(session, Grid, grid_id)
    rows = session.scalars(select(Evaluation).where(Evaluation.grid_id == grid_id).order_by(Evaluation.id.desc()))
    return [EvaluationView.from_row(e) for e in rows]


@router.get("/{grid_id}/evaluations/{evaluation_id}", response_model=EvaluationView,
            responses={404: {"description": "no such grid or evaluation"}})  # fmt: skip
def get_evaluation(
    grid_id: int, evaluation_id: Annotated[int, Path(ge=1, le=MAX_ID)], session: SessionDep
) -> EvaluationView:
    """Its state (queued, running, completed, failed), what it cost (GPU-seconds the nodes measured) and
    each run's job with its metrics once completed."""
    return EvaluationView.from_row(_evaluation_of(session, grid_id, evaluation_id))


@router.delete("/{grid_id}/evaluations/{evaluation_id}", response_model=EvaluationView,
               responses={**AUTH_RESPONSES, 404: {"description": "no such grid or evaluation"},
                          409: {"description": "the evaluation has ended"}})  # fmt: skip
def cancel_evaluation(
    grid_id: int, evaluation_id: Annotated[int, Path(ge=1, le=MAX_ID)], session: SessionDep, _: AuthDep
) -> EvaluationView:
    """Cancel an evaluation: its queued jobs never start and its running ones are ended at the launcher's
    next poll; it reads failed, `error` "cancelled by the user". 409 where it had completed or failed."""
    evaluation = _evaluation_of(session, grid_id, evaluation_id)
    if not cancel(evaluation):
        raise HTTPException(status.HTTP_409_CONFLICT,
                            detail=f"evaluation {evaluation_id} has {evaluation.state} already: nothing to cancel")
    session.commit()
    return EvaluationView.from_row(evaluation)


def _evaluation_of(session: Session, grid_id: int, evaluation_id: int) -> Evaluation:
    get_or_404(session, Grid, grid_id)
    evaluation = session.get(Evaluation, evaluation_id)
    if evaluation is None or evaluation.grid_id != grid_id:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"grid {grid_id} has no evaluation {evaluation_id}")
    return evaluation
