"""Imports: recorded curves stored as a finished grid, the collapse detector replayed over them (`ablate import`
reads the file, in any format it knows, and sends its curves here)."""

from __future__ import annotations

from fastapi import APIRouter, status

from orchestrator.api.schemas import CurvesImport, GridDetail
from orchestrator.grids.service import latest_metrics
from orchestrator.results.curves_import import import_body
from orchestrator.web.deps import AUTH_RESPONSES, AuthDep, SessionDep

router = APIRouter(prefix="/api/grids", tags=["grids"])


@router.post(
    "/import",
    status_code=status.HTTP_201_CREATED,
    response_model=GridDetail,
    responses={**AUTH_RESPONSES, 422: {"description": "curves that cannot be imported, the field named"}},
)
def post_import(body: CurvesImport, session: SessionDep, _: AuthDep) -> GridDetail:
    """Store the curves as a finished grid: one run per curve (completed, or stopped where the detector
    stops it, with its reason and best checkpoint), one metric row per checkpoint. Request bodies are capped
    by ABLATE_MAX_BODY_BYTES."""
    grid = import_body(session, body)
    return GridDetail.from_rows(grid, latest_metrics(session, [r.id for r in grid.runs]))
