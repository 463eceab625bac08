"""A grid's report, rendered on request from the DB: GET /api/grids/{id}/report.html, .json or .md."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Response

from orchestrator.db.models import Grid
from orchestrator.results.reports.build import build_report
from orchestrator.results.reports.render import MEDIA_TYPES, RENDERERS
from orchestrator.web.deps import SessionDep, SettingsDep, get_or_404

router = APIRouter(prefix="/api/grids", tags=["reports"])


@router.get(
    "/{grid_id}/report.{fmt}",
    response_class=Response,
    responses={
        404: {"description": "no such grid"},
        200: {"content": {t.split(";")[0]: {} for t in MEDIA_TYPES.values()}, "description": "the report"},
    },
)
def get_report(
    grid_id: int, fmt: Literal["html", "json", "md"], session: SessionDep, settings: SettingsDep
) -> Response:
    """Self-contained (HTML: images as data URIs, curves as inline SVG); a live grid's report says so."""
    grid = get_or_404(session, Grid, grid_id)
    report = build_report(session, grid, dict(settings.checkpoint_options))
    return Response(RENDERERS[fmt](report), media_type=MEDIA_TYPES[fmt])
