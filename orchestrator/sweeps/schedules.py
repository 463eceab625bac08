"""Schedules: cron expressions in the database that fire sweeps; create, list, pause, resume, delete,
and the misfire arithmetic (which fire times passed while the controller was down). Cron times are UTC."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from croniter import croniter
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Schedule, Sweep, utcnow
from orchestrator.errors import Conflict, InvalidBody, NotFound
from orchestrator.fleet.inventory import NAME_PATTERN, find_named, find_node
from orchestrator.fleet.providers.request import NodeRequest
from orchestrator.grids.gpu_share import gpu_count_errors, sweep_node_gpus
from orchestrator.grids.service import GridCreate, GridError, PathPolicy, memory_errors, resolve_grid
from orchestrator.messages import validation_text


class ScheduleError(ValueError):
    """A schedule that cannot be created or changed; one line naming the field."""


class ScheduleNotFound(NotFound, ScheduleError):
    """No schedule of that name."""


class ScheduleConflict(Conflict, ScheduleError):
    """The name is taken, or a sweep of the schedule is under way."""


class ScheduleInvalid(InvalidBody, ScheduleError):
    """A schedule body that names what does not exist (unknown nodes)."""


def aware(dt: datetime) -> datetime:
    """SQLite hands back naive datetimes; every stored time is UTC."""
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)


def next_fire(cron: str, after: datetime) -> datetime:
    """The first cron time strictly after `after` (UTC)."""
    return croniter(cron, aware(after)).get_next(datetime)


class ScheduleCreate(BaseModel):
    """A schedule as POST /api/schedules and `ablate schedules create` take it."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, examples=["nightly-abcd"])
    # Five-field cron, UTC: "0 22 * * *" fires at 22:00 UTC every day.
    cron: str = Field(min_length=1, max_length=120, examples=["0 22 * * *"])  # the validator explains bad ones
    # A grid body exactly as POST /api/grids takes it; validated now, not at 22:00.
    grid: dict[str, Any] = Field(examples=[{"name": "abcd", "arms": ["A", "B", "C", "D"]}])
    # Either registered nodes by name (the operator rented them) or a request for nodes the sweep rents at
    # each fire and destroys at its end; exactly one of the two.
    nodes: list[str] | None = Field(default=None, min_length=1, max_length=64, examples=[["quad-4090-a"]])
    request: NodeRequest | None = Field(
        default=None,
        validate_default=True,  # so "neither given" is reported, under this field
        examples=[{"provider": "vast", "gpu": "RTX_4090", "nodes": 2, "max_price_per_gpu_hour": 0.45}],
    )
    # Most to spend per sweep, in the units of the nodes' price_per_hour; None: no cap.
    budget: float | None = Field(default=None, gt=0, le=1e9)
    # A fire missed while the controller was down: run it once, late, or skip to the next.
    misfire: Literal["run_once", "skip"] = "run_once"

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, v: str) -> str:
        if len(v.split()) != 5 or not croniter.is_valid(v):
            raise ValueError("must be a five-field cron expression (minute hour day month weekday), e.g. '0 22 * * *'")
        return v

    @field_validator("grid")
    @classmethod
    def _valid_grid(cls, v: dict[str, Any]) -> dict[str, Any]:
        try:
            resolve_grid(GridCreate.model_validate(v))
        except ValidationError as exc:
            raise ValueError(validation_text(exc, root="(grid)")) from None
        except GridError as exc:
            raise ValueError(exc.message()) from None
        return v

    @field_validator("nodes")
    @classmethod
    def _unique_nodes(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and len(set(v)) != len(v):
            raise ValueError("each node may appear once")
        return v

    @field_validator("request")
    @classmethod
    def _nodes_or_request(cls, v: NodeRequest | None, info: ValidationInfo) -> NodeRequest | None:
        named = info.data.get("nodes")
        if v is not None and named:
            raise ValueError("give either nodes (registered machines) or request (nodes to rent), not both")
        if v is None and not named and "nodes" in info.data:  # nodes absent from info.data: it failed itself
            raise ValueError("give nodes (registered machine names) or request (provider, gpu, ... to rent)")
        return v


def create_schedule(
    session: Session,
    body: ScheduleCreate,
    now: datetime | None = None,
    max_gpu_memory_gib: float | None = None,
    paths: PathPolicy | None = None,
) -> Schedule:
    """Store a schedule; its first fire is the next cron time after `now`. Flushes, no commit.

    Its grid must fit a GPU (`max_gpu_memory_gib`), its arms the GPUs of the nodes it rents (or names), and,
    with `paths`, keep its spec paths under the operator's directories, as a grid submitted now would
    (ScheduleInvalid under ["grid", ...]).
    """
    grid = GridCreate.model_validate(body.grid)
    resolved = resolve_grid(grid)  # valid: ScheduleCreate checked it
    problems = memory_errors(grid, resolved, max_gpu_memory_gib)
    # The nodes it rents have gpus_per_node GPUs; named ones what their last probe found (None: unknown).
    node_gpus = body.request.gpus_per_node if body.request is not None else sweep_node_gpus(session, body.nodes or [])
    problems += gpu_count_errors(grid.arms, grid.overrides, resolved, node_gpus)
    if paths is not None:
        problems = paths.errors(grid, resolved) + problems
    if problems:
        raise ScheduleInvalid([{**p, "loc": ["grid", *p["loc"]]} for p in problems])
    if find_schedule(session, body.name) is not None:
        raise ScheduleConflict(f"a schedule named {body.name!r} already exists")
    names = body.nodes or []
    missing = [n for n in names if find_node(session, n) is None]
    if missing:
        msg = f"unknown node(s) {', '.join(missing)}; register them with `ablate nodes add`"
        raise ScheduleInvalid([{"loc": ["nodes"], "msg": msg, "type": "value_error"}])
    schedule = Schedule(
        name=body.name,
        cron=body.cron,
        grid=body.grid,
        nodes=names,
        request=body.request.model_dump(mode="json") if body.request is not None else None,
        budget=body.budget,
        misfire=body.misfire,
        next_fire_at=next_fire(body.cron, now or utcnow()),
    )
    session.add(schedule)
    session.flush()
    return schedule


def find_schedule(session: Session, name: str) -> Schedule | None:
    return find_named(session, Schedule, name)


def get_schedule(session: Session, name: str) -> Schedule:
    schedule = find_schedule(session, name)
    if schedule is None:
        raise ScheduleNotFound(f"no schedule named {name!r}; `ablate schedules list` shows them")
    return schedule


def list_schedules(session: Session) -> list[Schedule]:
    return list(session.scalars(select(Schedule).order_by(Schedule.name)))


def pause_schedule(session: Session, name: str) -> Schedule:
    """No more fires until resumed; a sweep already under way carries on."""
    schedule = get_schedule(session, name)
    schedule.paused = True
    session.flush()
    return schedule


def resume_schedule(session: Session, name: str, now: datetime | None = None) -> Schedule:
    """Fire again from the next cron time after now; fires that fell in the pause are not misfires."""
    schedule = get_schedule(session, name)
    schedule.paused = False
    schedule.next_fire_at = next_fire(schedule.cron, now or utcnow())
    session.flush()
    return schedule


def delete_schedule(session: Session, name: str) -> None:
    schedule = get_schedule(session, name)
    if session.scalar(select(Sweep.id).where(Sweep.schedule_id == schedule.id, Sweep.under_way)):
        raise ScheduleConflict(f"schedule {name!r} has a sweep under way; wait for it or stop it first")
    session.delete(schedule)
    session.flush()


def fire_times(cron: str, first: datetime, now: datetime) -> list[datetime]:
    """Cron times from `first` (inclusive) to `now` (inclusive), at most 1000."""
    times = [first]
    it = croniter(cron, first)
    while len(times) < 1000:
        t = it.get_next(datetime)
        if t > now:
            break
        times.append(t)
    return times
