"""Schedules: cron-fired sweeps on rented nodes. Create, list, read (with recent sweeps), pause, resume, delete."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, HTTPException, Response, status
from pydantic import BaseModel

from orchestrator.api.deps import AuthDep, SessionDep, SettingsDep
from orchestrator.db.models import Schedule
from orchestrator.grids import GridCreate, gpu_memory_cap_gib, memory_errors, path_errors, resolve_grid
from orchestrator.nodes import find_node
from orchestrator.sweeps import (
    ScheduleCreate,
    ScheduleError,
    create_schedule,
    delete_schedule,
    find_schedule,
    list_schedules,
    pause_schedule,
    resume_schedule,
    schedule_public,
)

router = APIRouter(prefix="/api/schedules", tags=["schedules"])

_AUTH = {401: {"description": "missing or wrong bearer token"}}
_404 = {404: {"description": "no such schedule"}}


class SweepPublic(BaseModel):
    id: int
    state: str  # provisioning | running | stopping | collecting | completed | stopped | failed
    scheduled_for: datetime
    fired_at: datetime
    late: bool
    grid_id: int | None
    nodes: list[str]
    price_per_hour: float
    budget: float | None
    spend: float
    stop_reason: str | None
    error: str | None
    results_dir: str | None
    finished_at: datetime | None


class SchedulePublic(BaseModel):
    id: int
    name: str
    cron: str
    grid: dict[str, Any]
    nodes: list[str]
    budget: float | None
    misfire: str
    paused: bool
    last_fire_at: datetime | None
    next_fire_at: datetime | None
    created_at: datetime
    sweeps: list[SweepPublic]  # the 20 most recent, newest first


def _schedule_or_404(session: SessionDep, name: str) -> Schedule:
    schedule = find_schedule(session, name)
    if schedule is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no schedule named {name!r}")
    return schedule


@router.get("", response_model=list[SchedulePublic], responses=_AUTH)
def get_schedules(session: SessionDep, _: AuthDep) -> list[dict[str, Any]]:
    return [schedule_public(session, s) for s in list_schedules(session)]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=SchedulePublic,
    responses={**_AUTH, 409: {"description": "name taken"}},
)
def post_schedule(body: ScheduleCreate, session: SessionDep, settings: SettingsDep, _: AuthDep) -> dict[str, Any]:
    """Store a schedule; its grid is validated now and submitted at each fire. Cron times are UTC."""
    grid = GridCreate.model_validate(body.grid)
    resolved = resolve_grid(grid)  # valid: ScheduleCreate checked it
    problems = path_errors(grid, resolved, settings.weights_dirs, settings.data_dirs) + memory_errors(
        grid, resolved, gpu_memory_cap_gib(session, settings.max_gpu_memory_gib)
    )
    if problems:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            detail=[{**p, "loc": ["body", "grid", *p["loc"]]} for p in problems],
        )
    if find_schedule(session, body.name) is not None:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=f"a schedule named {body.name!r} already exists")
    missing = [n for n in body.nodes if find_node(session, n) is None]
    if missing:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            detail=[{"loc": ["body", "nodes"], "msg": f"unknown node(s): {', '.join(missing)}", "type": "value_error"}],
        )
    return schedule_public(session, create_schedule(session, body))


@router.get("/{name}", response_model=SchedulePublic, responses={**_AUTH, **_404})
def get_schedule(name: str, session: SessionDep, _: AuthDep) -> dict[str, Any]:
    return schedule_public(session, _schedule_or_404(session, name))


@router.post("/{name}/pause", response_model=SchedulePublic, responses={**_AUTH, **_404})
def post_pause(name: str, session: SessionDep, _: AuthDep) -> dict[str, Any]:
    """No more fires until resumed; a sweep under way carries on."""
    _schedule_or_404(session, name)
    return schedule_public(session, pause_schedule(session, name))


@router.post("/{name}/resume", response_model=SchedulePublic, responses={**_AUTH, **_404})
def post_resume(name: str, session: SessionDep, _: AuthDep) -> dict[str, Any]:
    """Fire again from the next cron time; fires that fell in the pause are not run."""
    _schedule_or_404(session, name)
    return schedule_public(session, resume_schedule(session, name))


@router.delete(
    "/{name}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses={**_AUTH, **_404, 409: {"description": "a sweep is under way"}},
)
def delete_schedule_by_name(name: str, session: SessionDep, _: AuthDep) -> Response:
    _schedule_or_404(session, name)
    try:
        delete_schedule(session, name)
    except ScheduleError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from None
    return Response(status_code=status.HTTP_204_NO_CONTENT)
