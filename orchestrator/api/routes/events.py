"""Events: the history of runs, grids, sweeps and nodes, newest first, filterable by node, run, grid and
kind. Behind the token always (a node's commands and their output are infrastructure, like /api/nodes)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from orchestrator.api.schemas import EventPublic
from orchestrator.db.events import MAX_LISTED, list_events
from orchestrator.fleet.inventory import get_node
from orchestrator.web.deps import AUTH_RESPONSES, MAX_ID, AuthDep, SessionDep

router = APIRouter(prefix="/api/events", tags=["events"])
# Every kind the controller writes ("checkpoint.stored"), so a NUL (which Postgres refuses) never reaches the DB.
KIND_PATTERN = r"^[a-z][a-z0-9_.]*$"


@router.get("", response_model=list[EventPublic], responses={**AUTH_RESPONSES, 404: {"description": "no such node"}})
def get_events(
    session: SessionDep,
    _: AuthDep,
    node: Annotated[str | None, Query(description="a registered node's name")] = None,
    run: Annotated[int | None, Query(ge=1, le=MAX_ID, description="a run's id")] = None,
    grid: Annotated[int | None, Query(ge=1, le=MAX_ID, description="a grid's id")] = None,
    kind: Annotated[
        str | None,
        Query(max_length=64, pattern=KIND_PATTERN, description='a kind, or a prefix ending in "." ("node.")'),
    ] = None,
    before: Annotated[
        int | None, Query(ge=1, le=MAX_ID, description="only events older than this id (the next page)")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LISTED)] = 100,
) -> list[EventPublic]:
    row = get_node(session, node) if node is not None else None
    found = list_events(session, node=row, run_id=run, grid_id=grid, kind=kind, before_id=before, limit=limit)
    return [EventPublic.model_validate(e) for e in found]
