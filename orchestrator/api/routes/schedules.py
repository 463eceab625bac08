"""Schedules: cron-fired sweeps on rented nodes. Create, list, read (with recent sweeps), pause, resume, delete.

Errors (unknown schedule 404, name taken or sweep under way 409, unknown nodes or a grid that breaks
the controller's limits 422) are mapped in orchestrator/api/errors.py.
"""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from orchestrator.api.schemas import ScheduleCreate, SchedulePublic
from orchestrator.grids.service import PathPolicy, gpu_memory_cap_gib
from orchestrator.sweeps.schedules import (
    create_schedule,
    delete_schedule,
    get_schedule,
    list_schedules,
    pause_schedule,
    resume_schedule,
)
from orchestrator.web.deps import AUTH_RESPONSES, AuthDep, SessionDep, SettingsDep

router = APIRouter(prefix="/api/schedules", tags=["schedules"])

_404 = {404: {"description": "no such schedule"}}


@router.get("", response_model=list[SchedulePublic], responses=AUTH_RESPONSES)
def get_schedules(session: SessionDep, _: AuthDep) -> list[SchedulePublic]:
    return [SchedulePublic.model_validate(s) for s in list_schedules(session)]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=SchedulePublic,
    responses={**AUTH_RESPONSES, 409: {"description": "name taken"}},
)
def post_schedule(body: ScheduleCreate, session: SessionDep, settings: SettingsDep, _: AuthDep) -> SchedulePublic:
    """Store a schedule; its grid is validated now and submitted at each fire. Cron times are UTC."""
    schedule = create_schedule(
        session,
        body,
        max_gpu_memory_gib=gpu_memory_cap_gib(session, settings.max_gpu_memory_gib),
        paths=PathPolicy.from_settings(settings),
    )
    return SchedulePublic.model_validate(schedule)


@router.get("/{name}", response_model=SchedulePublic, responses={**AUTH_RESPONSES, **_404})
def get_schedule_by_name(name: str, session: SessionDep, _: AuthDep) -> SchedulePublic:
    return SchedulePublic.model_validate(get_schedule(session, name))


@router.post("/{name}/pause", response_model=SchedulePublic, responses={**AUTH_RESPONSES, **_404})
def post_pause(name: str, session: SessionDep, _: AuthDep) -> SchedulePublic:
    """No more fires until resumed; a sweep under way carries on."""
    return SchedulePublic.model_validate(pause_schedule(session, name))


@router.post("/{name}/resume", response_model=SchedulePublic, responses={**AUTH_RESPONSES, **_404})
def post_resume(name: str, session: SessionDep, _: AuthDep) -> SchedulePublic:
    """Fire again from the next cron time; fires that fell in the pause are not run."""
    return SchedulePublic.model_validate(resume_schedule(session, name))


@router.delete(
    "/{name}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses={**AUTH_RESPONSES, **_404, 409: {"description": "a sweep is under way"}},
)
def delete_schedule_by_name(name: str, session: SessionDep, _: AuthDep) -> Response:
    delete_schedule(session, name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
