"""Grids: submit one (one queued run per arm), list them, show one with its runs' latest metrics, stop one."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status
from sqlalchemy import select
from sqlalchemy.orm import selectinload

from model.extractors.pinned_files import default_weights_dir
from model.spec import DISTRIBUTION_METRICS, ArmSpec
from orchestrator.api.schemas import GridCreate, GridCreated, GridDetail, GridPublic, GridStopped
from orchestrator.db.models import Grid
from orchestrator.grids.gpu_share import node_gpus
from orchestrator.grids.night import PlanPublic
from orchestrator.grids.replicates import grid_cost
from orchestrator.grids.service import PathPolicy, create_grid, gpu_memory_cap_gib, latest_metrics
from orchestrator.grids.standin_decisions import decided_standin_warnings
from orchestrator.grids.stopping import stop_grid
from orchestrator.results.deciding.submit_cost import decide_cost
from orchestrator.web.deps import AUTH_RESPONSES, MAX_ID, AuthDep, SessionDep, SettingsDep, get_or_404

router = APIRouter(prefix="/api/grids", tags=["grids"])


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=GridCreated,
    responses={**AUTH_RESPONSES, 422: {"description": "invalid grid"}},
)
def submit_grid(body: GridCreate, session: SessionDep, settings: SettingsDep, _: AuthDep) -> GridCreated:
    """Store the grid and queue one run per arm and training seed (`seeds`, 1-16, or a deciding grid's
    `decide.min_seeds`: its worst case and expected GPU-hours come with the answer); the answer says what it
    costs: runs and projected GPU-hours, and the night plan (each run's GPUs, start and end, the night and
    its lower bound) when any node's GPUs are known. Invalid arms, arms whose estimated peak GPU memory exceeds
    ABLATE_MAX_GPU_MEMORY_GIB or that ask for more GPUs than the largest node has, and trackers whose
    client is not installed answer 422 naming the field path (and the estimate, or the extra to install).
    A decision on a distribution metric whose extractor weights are not staged is accepted with a warning
    naming the metric and `ablate weights fetch NAME` (its nodes would measure it with a stand-in)."""
    cap = gpu_memory_cap_gib(session, settings.max_gpu_memory_gib)
    paths = PathPolicy.from_settings(settings)
    nodes = node_gpus(session, settings)
    grid = create_grid(session, body, max_gpu_memory_gib=cap, paths=paths, default_trackers=settings.trackers,
                       nodes=nodes or None)
    session.commit()  # committed before the 201 goes out, so the id is durable when the client sees it
    first = [(r.arm, ArmSpec.model_validate(r.spec)) for r in grid.runs if r.seed == 0]
    cost = grid_cost([spec for _, spec in first], grid.seeds)
    deciding = decide_cost(first, grid.control_arm, body.decide) if body.decide is not None else None
    warnings = [] if body.decide is None else decided_standin_warnings(
        [m for m in body.decide.margin if m in DISTRIBUTION_METRICS], default_weights_dir(),
        settings.checkpoint_root, settings.checkpoint_options)  # fmt: skip
    return GridCreated(id=grid.id, runs=cost.runs, seeds=cost.seeds, projected_gpu_hours=cost.gpu_hours,
                       cost=cost.text() + (f"; {deciding.words}" if deciding else ""),
                       plan=None if grid.plan is None else PlanPublic.model_validate(grid.plan),
                       worst_case_gpu_hours=deciding.worst_case_gpu_hours if deciding else None,
                       expected_gpu_hours=deciding.expected_gpu_hours if deciding else None, warnings=warnings)


@router.get("", response_model=list[GridPublic])
def list_grids(
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
) -> list[GridPublic]:
    """Newest first."""
    grids = session.scalars(
        select(Grid).options(selectinload(Grid.runs)).order_by(Grid.id.desc()).limit(limit).offset(offset)
    )
    return [GridPublic.from_row(g) for g in grids]


@router.get("/{grid_id}", response_model=GridDetail, responses={404: {"description": "no such grid"}})
def get_grid(grid_id: int, session: SessionDep) -> GridDetail:
    grid = get_or_404(session, Grid, grid_id)
    return GridDetail.from_rows(grid, latest_metrics(session, [r.id for r in grid.runs]))


@router.post(
    "/{grid_id}/stop",
    response_model=GridStopped,
    responses={**AUTH_RESPONSES, 404: {"description": "no such grid"}},
)
def request_grid_stop(grid_id: int, session: SessionDep, _: AuthDep) -> GridStopped:
    """Stop every run of the grid, as POST /api/runs/{id}/stop stops one: queued runs at once (decision
    "user"), starting/running ones at their next step with a checkpoint kept (the launcher stops them).
    Idempotent: runs already ended or already being stopped are left as they are; the answer says, per run,
    what the request did (`stopped`, `stop_requested`, `already_stopping`, `already_ended`)."""
    stopped = stop_grid(session, get_or_404(session, Grid, grid_id))
    session.commit()
    return stopped
