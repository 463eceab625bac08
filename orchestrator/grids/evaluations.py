"""An evaluation of a grid's stored checkpoints on more held-out images: the request checked and stored
as one queued job per run (orchestrator/runs/evaluation_jobs.py runs them on nodes, like runs).

Which runs: every built-in run of the grid with a checkpoint (a command arm's metrics are its own
trainer's: ablate cannot evaluate its checkpoints). Which step: "final" (each run's last checkpoint),
"best" (each run's best.pt) or a step number that every run still holds: its final or best step, or one
of the last KEEP_PERIODIC periodic checkpoints a run's directory and storage keep. A grid with runs still
queued or running is refused (422 naming `step`): their final checkpoint is not known yet.

Distribution metrics (`samples`, `metrics`: CMMD, DINO-MMD, FD-DINOv2, model/distribution_pass.py) are measured
on `samples` generated images per run, sample i from the same prompt and noise in every run, against the held-out
split; they are asked on each job's `extra["asked"]`, which the controller checks the node's record against.
`images` defaults to the smallest eval.num_samples of the runs, so the row still carries every per-image metric.

Used by the REST API and the CLI, so both get the same checks and the same error paths.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from model.spec import DistributionMetric, DistributionSpec
from orchestrator.db.models import Evaluation, EvaluationResult, Grid, Metric, Run
from orchestrator.errors import InvalidBody
from orchestrator.vocabulary import TERMINAL_STATES, EvaluationState
from worker.protocol import MAX_STEP
from worker.run_files import KEEP_PERIODIC

MAX_IMAGES = 100_000  # far past any held-out split; the split's own size is the real bound

StepChoice = Literal["final", "best"] | Annotated[int, Field(ge=0, le=MAX_STEP)]


# The per-image metrics an evaluation may measure (model/evaluate.py): the LPIPS metrics, from generating each
# image (the sampler's eval.sampler_steps passes, most of an evaluation's cost), and the flow loss (8 forward
# passes an image; its headline val_flow_ivw is read from its grid). An evaluation records which it measured
# (`Evaluation.measures`): every one where a user asked (`ablate evaluate`), the flow loss alone where a
# deciding grid's look asked and every metric it decides on is the flow loss's (grids/deciding.py measures_of).
LPIPS_METRICS = ("recon_lpips", "text_lpips", "text_manip_delta")
FLOW_METRICS = ("val_flow_loss",)
EVERY_METRIC = (*LPIPS_METRICS, *FLOW_METRICS)


def measured_by(evaluation: Evaluation) -> tuple[str, ...]:
    """The per-image metrics `evaluation` measured (one stored before they were recorded: every one)."""
    return tuple(evaluation.measures) if evaluation.measures else EVERY_METRIC


def flow_only(measures: Sequence[str]) -> bool:
    """Whether an evaluation measuring `measures` skips the LPIPS metrics' sampling."""
    return not set(measures) & set(LPIPS_METRICS)


ASKED = "asked"  # a job's `extra` key: the distribution samples and metrics its record must carry
DISTRIBUTION_ONLY = "distribution_only"  # in ASKED: the images' metrics of this evaluation stand for nothing
# A job's `extra` key: True where the run's own training job scored it at its end, the model still loaded
# (runs/in_training.py): no start of its own, and its GPU time is inside the run's.
IN_TRAINING = "in_training"


def ran_in_training(job: EvaluationResult) -> bool:
    """Whether the run's training job scored this job's result (IN_TRAINING)."""
    return (job.extra or {}).get(IN_TRAINING) is True


class EvaluationCreate(BaseModel):
    """POST /api/grids/{id}/evaluations and `ablate evaluate`: how many held-out images and generated samples,
    which distribution metrics, at which step."""

    model_config = ConfigDict(extra="forbid")

    images: Annotated[int, Field(ge=1, le=MAX_IMAGES, examples=[256])] | None = None  # None: eval.num_samples
    samples: Annotated[int, Field(ge=8, le=4096, examples=[2000])] | None = None  # generated images per run
    metrics: Annotated[list[DistributionMetric], Field(max_length=3)] | None = None  # None: eval.distribution's
    step: StepChoice = "final"

    @field_validator("metrics")
    @classmethod
    def _offered(cls, metrics: list[str] | None) -> list[str] | None:
        try:  # eval.distribution.metrics' own checks: fid refused, each metric once
            return None if metrics is None else DistributionSpec(metrics=metrics).metrics
        except ValidationError as exc:
            raise ValueError(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None


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


def _eval_of(run: Run) -> dict:
    return (run.spec or {}).get("eval") or {}


def _distribution_asked(body: EvaluationCreate, runs: list[Run], split: int) -> dict | None:
    """{"samples", "metrics"} the jobs measure, or None: the body's, else the runs' eval.distribution."""
    specs = [_eval_of(r).get("distribution") or {} for r in runs]
    measured = list(dict.fromkeys(m for d in specs for m in d.get("metrics", [])))
    metrics = body.metrics if body.metrics is not None else measured
    if body.samples is None and body.metrics is None:
        return None  # the images' metrics only, as before distribution metrics
    if not metrics:
        raise _error("metrics", "no distribution metric asked for and the runs measure none: name some, e.g. "
                                "\"metrics\": [\"cmmd\", \"fd_dinov2\"]")
    samples = body.samples if body.samples is not None else min(d.get("samples", 2000) for d in specs)
    if samples > split:
        raise _error("samples", f"{samples} samples asked for, but the held-out split has {split} images "
                                f"(data.held_out), the reference needs at least as many: ask for at most {split}")
    return {"samples": samples, "metrics": metrics}


def create_evaluation(session: Session, grid: Grid, body: EvaluationCreate, distribution_only: bool = False,
                      only: Sequence[Run] | None = None,
                      measures: Sequence[str] = EVERY_METRIC) -> Evaluation:  # fmt: skip
    """Check the request against the grid and store it with one queued job per run (the caller commits);
    an InvalidBody (HTTP 422) names `images` or `step` and what would be accepted. `distribution_only`: the
    report reads only its distribution metrics (the pass at the best checkpoints, results/best_distribution.py).
    `only`: jobs for these of the grid's runs alone (a decider's catch-up, which scores the runs an earlier
    evaluation of the same images did not; the images asked are still checked against every run's split).
    `measures`: the per-image metrics its jobs measure (EVERY_METRIC; a deciding grid's look asks the flow loss
    alone where it decides on nothing else), recorded on the evaluation."""
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
    images = body.images if body.images is not None else min(_eval_of(r).get("num_samples", 25) for r in runs)
    if images > split:
        raise _error("images", f"{images} images asked for, but the held-out split has {split} "
                               f"(data.held_out): ask for at most {split}, or hold out more images in a new grid")
    asked = _distribution_asked(body, runs, split)
    if asked and distribution_only:
        asked[DISTRIBUTION_ONLY] = True
    if only is not None:
        runs = [r for r in runs if r.id in {o.id for o in only}]
    steps = {r.id: _step_of(session, r, body.step) for r in runs}
    if not measures or set(measures) - set(EVERY_METRIC):
        raise ValueError(f"an evaluation measures some of {', '.join(EVERY_METRIC)}, not {list(measures)}")
    evaluation = Evaluation(grid_id=grid.id, images=images, step=str(body.step), state=EvaluationState.queued,
                            measures=[m for m in EVERY_METRIC if m in measures])  # fmt: skip
    session.add(evaluation)
    session.flush()
    for r in runs:
        extra = {ASKED: asked} if asked else {}
        session.add(EvaluationResult(evaluation_id=evaluation.id, run_id=r.id, step=steps[r.id], extra=extra))
    session.flush()
    return evaluation
