"""Runs: one arm of one grid. Read it, read its metrics, ask it to stop."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.api.schemas import MetricPublic, RunPublic
from orchestrator.db.models import Metric, Run
from orchestrator.grids.service import latest_metrics, stop_run
from orchestrator.web.deps import AUTH_RESPONSES, AuthDep, SessionDep, get_or_404

router = APIRouter(prefix="/api/runs", tags=["runs"])

_404 = {404: {"description": "no such run"}}


def _public(session: Session, run: Run) -> RunPublic:
    return RunPublic.from_row(run, latest_metrics(session, [run.id]).get(run.id))


@router.get("/{run_id}", response_model=RunPublic, responses=_404)
def get_run(run_id: int, session: SessionDep) -> RunPublic:
    return _public(session, get_or_404(session, Run, run_id))


@router.get("/{run_id}/metrics", response_model=list[MetricPublic], responses=_404)
def get_metrics(run_id: int, session: SessionDep) -> list[MetricPublic]:
    """Every checkpoint of the run, in step order."""
    run = get_or_404(session, Run, run_id)
    rows = session.scalars(select(Metric).where(Metric.run_id == run.id).order_by(Metric.step))
    return [MetricPublic.model_validate(m) for m in rows]


@router.post(
    "/{run_id}/stop",
    response_model=RunPublic,
    responses={**_404, **AUTH_RESPONSES, 409: {"description": "already finished"}},
)
def request_stop(run_id: int, session: SessionDep, _: AuthDep) -> RunPublic:
    """Queued: stopped at once (decision "user"). Starting/running: the launcher stops it gracefully."""
    run = stop_run(session, get_or_404(session, Run, run_id))
    session.commit()
    return _public(session, run)
