"""The dashboard's pages and the read-only JSON/CSV they use. No auth: the dashboard never writes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from orchestrator.dashboard.data import (
    PAGE_SIZE,
    failed_bootstraps,
    for_anonymous,
    grid_count,
    grid_detail,
    grid_rows,
    grid_version,
    metrics_csv,
    sweep_rows,
    unconfirmed_destroys,
    unreleased_nodes,
)
from orchestrator.db.models import Grid
from orchestrator.results.samples import KIND_LABELS
from orchestrator.vocabulary import for_script
from orchestrator.web.deps import MAX_ID, SessionDep, SettingsDep, get_or_404
from orchestrator.web.guard import token_matches

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
STATIC_URL = "/dashboard/static"
# How often an open page asks whether anything changed, in seconds (only while runs are live).
POLL_SECONDS = 3.0

templates = Jinja2Templates(directory=HERE / "templates")
router = APIRouter(tags=["dashboard"])


def _page(request: Request, name: str, **context: Any) -> HTMLResponse:
    context = {"static": STATIC_URL, "poll_seconds": POLL_SECONDS, "vocabulary": for_script(), **context}
    return templates.TemplateResponse(request, name, context)


Limit = Annotated[int, Query(ge=1, le=200)]
Offset = Annotated[int, Query(ge=0, le=MAX_ID)]


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def index_page(request: Request, session: SessionDep, limit: Limit = PAGE_SIZE, offset: Offset = 0) -> HTMLResponse:
    """The grid list, one page of it (newest first), rendered on the server (readable without JS) and
    refreshed by polling."""
    total = grid_count(session)
    sweeps = sweep_rows(session)
    if not token_matches(request.headers.get("authorization"), request.app.state.api_token):
        sweeps = for_anonymous(sweeps)  # no money, no remote command output: as /api/schedules, token only
    pages = {
        "newer": max(0, offset - limit) if offset > 0 else None,
        "older": offset + limit if offset + limit < total else None,
    }
    return _page(
        request,
        "index.html",
        grids=grid_rows(session, limit, offset),
        total=total,
        limit=limit,
        offset=offset,
        **pages,
        sweeps=sweeps,
        unreleased=unreleased_nodes(session),
        unconfirmed=unconfirmed_destroys(session),
        failed_bootstraps=failed_bootstraps(session),
    )


@router.get("/grids/{grid_id}", response_class=HTMLResponse, include_in_schema=False)
def grid_page(grid_id: int, request: Request, session: SessionDep) -> HTMLResponse:
    grid = get_or_404(session, Grid, grid_id)
    return _page(
        request, "grid.html", grid={"id": grid.id, "name": grid.name, "source": grid.source}, sample_kinds=KIND_LABELS
    )


@router.get("/api/dashboard/grids")
def dashboard_grids(session: SessionDep, limit: Limit = PAGE_SIZE, offset: Offset = 0) -> list[dict[str, Any]]:
    """Grid list rows: state, arms with states, started, GPU-hours (newest first), one page."""
    return grid_rows(session, limit, offset)


@router.get("/api/dashboard/grids/{grid_id}", responses={404: {"description": "no such grid"}})
def dashboard_grid(
    grid_id: int, session: SessionDep, settings: SettingsDep, since: str | None = None
) -> dict[str, Any]:
    """Everything the grid page draws. With `since` = the last `version` seen, an unchanged grid
    answers just {"version", "unchanged": true}, so polling a finished grid costs two small queries."""
    grid = get_or_404(session, Grid, grid_id)
    if since is not None:
        version = grid_version(session, grid.id, settings.checkpoint_alarm_minutes)
        if version == since:
            return {"version": version, "unchanged": True}
    return grid_detail(session, grid, settings.checkpoint_alarm_minutes)


@router.get(
    "/api/grids/{grid_id}/metrics.csv",
    response_class=Response,
    responses={200: {"content": {"text/csv": {}}}, 404: {"description": "no such grid"}},
    tags=["grids"],
)
def grid_metrics_csv(grid_id: int, session: SessionDep) -> Response:
    """Every checkpoint of every arm of the grid as CSV (one row per run and step)."""
    grid = get_or_404(session, Grid, grid_id)
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in grid.name)[:80] or "grid"
    return Response(
        metrics_csv(session, grid),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="grid{grid.id}_{safe}_metrics.csv"'},
    )
