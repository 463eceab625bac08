"""Runs: one arm of one grid. Read it, read its metrics, ask it to stop."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import select

from orchestrator.api.deps import AuthDep, SessionDep, get_or_404
from orchestrator.api.schemas import MetricPublic, RunPublic
from orchestrator.db.models import Metric, Run
from orchestrator.grids import latest_metrics, run_summary, stop_run

router = APIRouter(prefix="/api/runs", tags=["runs"])

_404 = {404: {"description": "no such run"}}


def _public(session: SessionDep, run: Run) -> dict:
    out = run_summary(run, latest_metrics(session, [run.id]).get(run.id))
    out.update(
        spec=run.spec,
        gpu_index=run.gpu_index,
        gpu_uuid=run.gpu_uuid,
        checkpoint_dir=run.checkpoint_dir,
        checkpoint_url=run.checkpoint_url,
        nodes=run.nodes or [],
        last_checkpoint_step=run.last_checkpoint_step,
        error=run.error,
        versions=run.versions,
    )
    return out


@router.get("/{run_id}", response_model=RunPublic, responses=_404)
def get_run(run_id: int, session: SessionDep) -> dict:
    return _public(session, get_or_404(session, Run, run_id))


@router.get("/{run_id}/metrics", response_model=list[MetricPublic], responses=_404)
def get_metrics(run_id: int, session: SessionDep) -> list[Metric]:
    """Every checkpoint of the run, in step order."""
    run = get_or_404(session, Run, run_id)
    return list(session.scalars(select(Metric).where(Metric.run_id == run.id).order_by(Metric.step)))


@router.post(
    "/{run_id}/stop",
    response_model=RunPublic,
    responses={**_404, 401: {"description": "missing or wrong bearer token"}, 409: {"description": "already finished"}},
)
def request_stop(run_id: int, session: SessionDep, _: AuthDep) -> dict:
    """Queued: stopped at once (decision "user"). Starting/running: the scheduler stops it gracefully."""
    run = stop_run(session, get_or_404(session, Run, run_id))
    session.commit()
    return _public(session, run)
