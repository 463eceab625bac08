"""A deciding grid's decision (GET /api/grids/{id}/decision) and the measured rates plans read (GET /api/rates)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from orchestrator.db.models import Grid
from orchestrator.grids.projection import RatesPublic, measured_rates
from orchestrator.results.deciding.grid_decision import GridDecision
from orchestrator.web.deps import SessionDep, get_or_404

router = APIRouter(prefix="/api", tags=["decisions"])


@router.get("/grids/{grid_id}/decision", response_model=GridDecision, responses={404: {"description": "no such grid"}})
def get_decision(grid_id: int, session: SessionDep) -> GridDecision:
    """Each comparison's decision at the latest look (better, worse, equivalent, undecided, open), its
    interval and the alpha it spends; the error rate held; GPU-hours spent against decide.max_gpu_hours; what
    each open comparison is still run for. A grid that does not decide answers `state: null`."""
    return GridDecision.of(session, get_or_404(session, Grid, grid_id))


@router.get("/rates", response_model=RatesPublic)
def get_rates(
    session: SessionDep,
    # Printable text only: a GPU's name as nvidia-smi gives it; a NUL would reach Postgres and fail there (a 500).
    gpu_model: Annotated[str | None, Query(max_length=200, pattern=r"^[^\x00-\x1f\x7f]*$",
                                           description="default: the GPU model most runs recorded")] = None,
) -> RatesPublic:
    """Steps per second measured per arm key and GPU count, and each arm key's fixed cost: what `ablate plan`
    projects a grid's runs with."""
    return RatesPublic.of(measured_rates(session, gpu_model))
