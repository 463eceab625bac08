"""Liveness with a database round trip: 200 when the controller can serve, 503 when its DB is gone."""

from __future__ import annotations

from fastapi import APIRouter, Response, status
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from orchestrator.api.schemas import Health
from orchestrator.version import version_text
from orchestrator.web.deps import SessionDep

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, responses={503: {"model": Health}})
def healthz(session: SessionDep, response: Response) -> Health:
    try:
        session.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
        return Health(status="degraded", database=f"unreachable: {type(exc).__name__}", version=version_text())
    return Health(status="ok", database="ok", version=version_text())
