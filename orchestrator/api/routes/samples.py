"""Sample images of a run: the list by step, and one PNG. Read-only and open like the other grid and run
reads, behind the token with ABLATE_PRIVATE_READS (orchestrator/web/guard.py); the dashboard's gallery and
the report show them."""

from __future__ import annotations

import logging

from fastapi import APIRouter, HTTPException, Path, Response, status

from orchestrator.db.models import Run
from orchestrator.results.samples import StepSamples, run_samples, sample_png
from orchestrator.web.deps import SessionDep, SettingsDep, get_or_404
from worker.stored_file import StoredFileRefused

log = logging.getLogger(__name__)
router = APIRouter(prefix="/api/runs", tags=["samples"])

_404 = {404: {"description": "no such run, step or image"}}


@router.get("/{run_id}/samples", response_model=list[StepSamples], responses=_404)
def list_samples(run_id: int, session: SessionDep) -> list[StepSamples]:
    """Every checkpoint's sample images (targets, reconstructions, text-only, caption/edit pairs), in step
    order, with the best and the final checkpoint marked."""
    return run_samples(session, get_or_404(session, Run, run_id))


@router.get(
    "/{run_id}/samples/{step}/{name}",
    response_class=Response,
    responses={**_404, 200: {"content": {"image/png": {}}, "description": "the PNG"}},
)
def get_sample(
    run_id: int,
    step: int,
    session: SessionDep,
    settings: SettingsDep,
    name: str = Path(pattern=r"^[a-z]+_\d{1,3}\.png$", max_length=16),
) -> Response:
    run = get_or_404(session, Run, run_id)
    try:
        data = sample_png(run, step, name, dict(settings.checkpoint_options))
    except StoredFileRefused as exc:  # a node wrote it: a link, too large, not a PNG
        # The path goes to the operator's log only: the answer may reach anonymous clients.
        log.warning("run %s: sample %s at step %s not served: %s", run_id, name, step, exc)
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"run {run_id}'s sample {name!r} at step "
                            f"{step} is not served: it is {exc.why}") from None
    if data is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            detail=f"run {run_id} has no sample {name!r} at step {step} (GET /api/runs/{run_id}/samples lists them)",
        )
    # Samples of a step never change once written: cacheable for a day (nosniff: orchestrator/app.py).
    return Response(data, media_type="image/png", headers={"Cache-Control": "public, max-age=86400"})
