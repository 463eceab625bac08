"""An evaluation of a grid's stored checkpoints on more held-out images: the request checked and stored
as one queued job per run (orchestrator/runs/evaluation_jobs.py runs them on nodes, like runs).

Which runs: every built-in run of the grid with a checkpoint (a command arm's metrics are its own
trainer's: ablate cannot evaluate its checkpoints). Which step: "final" (each run's last checkpoint),
"best" (each run's best.pt) or a step number that every run still holds: its final or best step, or one
of the last KEEP_PERIODIC periodic checkpoints a run's directory and storage keep. A grid with runs still
queued or running is refused (422 naming `step`): their final checkpoint is not known yet.

Used by the REST API and the CLI, so both get the same checks and the same error paths.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Evaluation, EvaluationResult, Grid, Metric, Run
from orchestrator.errors import InvalidBody
from orchestrator.vocabulary import TERMINAL_STATES, EvaluationState
from worker.protocol import MAX_STEP
from worker.run_files import KEEP_PERIODIC

MAX_IMAGES = 100_000  # far past any held-out split; the split's own size is the real bound

StepChoice = Literal["final", "best"] | Annotated[int, Field(ge=0, le=MAX_STEP)]


class EvaluationCreate(BaseModel):
    """POST /api/grids/{id}/evaluations and `ablate evaluate`: how many held-out images, at which step."""

    model_config = ConfigDict(extra="forbid")

    images: Annotated[int, Field(ge=1, le=MAX_IMAGES, examples=[256])]
    step: StepChoice = "final"


def _error(field: str, msg: str) -> InvalidBody:
    return InvalidBody([{"loc": [field], "msg": msg, "type": "value_error"}])


def evaluated_runs(grid: Grid) -> list[Run]:
    """The runs an evaluation covers: the grid's built-in runs that have a checkpoint."""
    return [r for r in grid.runs if not (r.spec or {}).get("command") and r.last_checkpoint_step is not None]


def held_out_size(run: Run) -> int:
    """The run's held-out split: the images an evaluation may draw from (data.held_out)."""
    return int(((run.spec or {}).get("data") or {}).get("held_out") or 0)


def kept_steps(session: Session, run: Run) -> set[int]:
    """The steps of the run whose checkpoint is still kept: final, best and the last KEEP_PERIODIC."""
    steps = session.scalars(
        select(Metric.step).where(Metric.run_id == run.id).order_by(Metric.step.desc()).limit(KEEP_PERIODIC)
    ).all()
    return {s for s in (run.last_checkpoint_step, run.best_step, *steps) if s is not None}


def _step_of(session: Session, run: Run, step: StepChoice) -> int:
    if step == "final":
        return int(run.last_checkpoint_step)  # type: ignore[arg-type]
    if step == "best":
        if run.best_step is None:
            raise _error("step", f"run {run.id} ({run.arm} s{run.seed}) has no best checkpoint: ask for \"final\"")
        return run.best_step
    if step not in kept_steps(session, run):
        kept = sorted(kept_steps(session, run))
        raise _error("step", f"run {run.id} ({run.arm} s{run.seed}) keeps no checkpoint of step {step} "
                             f"(it keeps steps {kept}): ask for \"final\", \"best\" or one of those")
    return int(step)


def create_evaluation(session: Session, grid: Grid, body: EvaluationCreate) -> Evaluation:
    """Check the request against the grid and store it with one queued job per run (the caller commits);
    an InvalidBody (HTTP 422) names `images` or `step` and what would be accepted."""
    active = [r for r in grid.runs if r.state not in TERMINAL_STATES]
    if active:
        names = ", ".join(f"{r.arm} s{r.seed}" for r in active[:5])
        raise _error("step", f"grid {grid.id} has {len(active)} runs still queued or running ({names}): their "
                             "final checkpoint is not known yet; evaluate once every run has ended")
    runs = evaluated_runs(grid)
    if not runs:
        raise _error("step", f"grid {grid.id} has no built-in run with a checkpoint to evaluate "
                             "(command arms and imported curves are not evaluated by ablate)")
    split = min(held_out_size(r) for r in runs)
    if body.images > split:
        raise _error("images", f"{body.images} images asked for, but the held-out split has {split} "
                               f"(data.held_out): ask for at most {split}, or hold out more images in a new grid")
    steps = {r.id: _step_of(session, r, body.step) for r in runs}
    evaluation = Evaluation(grid_id=grid.id, images=body.images, step=str(body.step), state=EvaluationState.queued)
    session.add(evaluation)
    session.flush()
    for r in runs:
        session.add(EvaluationResult(evaluation_id=evaluation.id, run_id=r.id, step=steps[r.id], extra={}))
    session.flush()
    return evaluation
