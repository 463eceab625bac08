"""A deciding grid's runs evaluated inside their training jobs (issue 62): at its last step a run's training job,
its model still loaded, evaluates its final checkpoint on the images the grid's first look would ask an
evaluation for, so that look finds the runs measured and no evaluation job pays a second start for them.

- Asked (`end_evaluation_of`, in the run's WorkerArgs.end_evaluation: runs/placement.py worker_args): a run of a
  deciding grid on one GPU, on the split's images up to decide.max_images (a look's `max_images`) where that is
  more than its training records measure, measuring what the grid decides on (grids/deciding.py measures_of: the
  flow loss alone where it decides on nothing else). Not asked where the grid's looks already evaluate other
  images (its largest evaluation's are not those): the catch-up scores a new seed on those, as before.
- Scored by the evaluation job's own code (worker/evaluation.py `score`, evaluate_in_training) and sent on the
  run's final record (worker/protocol.py IN_TRAINING_RECORD), taken off it before the record is stored.
- Stored (runs/in_training_store.py, by the launcher with the run's new final record) exactly as an evaluation job's
  result: checked as one (runs/evaluation_record.py refused_rows, the metric ranges), stored by the same code
  (runs/evaluation_jobs.py store_record) as a completed job of the grid's in-training evaluation (one per grid
  and images), marked IN_TRAINING on its `extra` (the API's `in_training`); its GPU time is inside its run's,
  so the grid's spend counts it once (results/deciding/budget.py). The decider's first look then reads those
  rows as the largest evaluation (results/evaluations.py largest_evaluation) and queues no evaluation for them.
- Falls back to a job: where the training job sent no evaluation, one that failed or one refused, the run's
  events say why (FAILED_KIND) and no row is stored, so the decider's catch-up (decider.py catch_up) queues an
  evaluation job of that run alone on the same images, or, where no run was scored in training, the first look
  asks for an evaluation of every run as before.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, object_session

from model.spec import ArmSpec
from orchestrator.db.models import Evaluation, Grid, Run
from orchestrator.grids.deciding import decide_of, measures_of
from orchestrator.grids.evaluations import ASKED, DISTRIBUTION_ONLY, flow_only, held_out_size
from orchestrator.vocabulary import EvaluationState
from worker.protocol import IN_TRAINING_ERROR, IN_TRAINING_RECORD, EndEvaluation

FAILED_KIND = "evaluation.in_training_failed"  # a run's event: not scored in training, an evaluation job will be
FINAL_STEP = "final"  # the step an in-training evaluation is stored as asked for: the run's last checkpoint


def _largest_images(session: Session | None, grid: Grid) -> int | None:
    """The images of the grid's largest completed evaluation of the images' metrics (one asked for distribution
    metrics alone is none: results/evaluations.py largest_evaluation), or None (none yet)."""
    if session is None:
        return None
    completed = session.scalars(select(Evaluation).where(
        Evaluation.grid_id == grid.id, Evaluation.state == EvaluationState.completed,
    ).order_by(Evaluation.images.desc()))  # fmt: skip
    for evaluation in completed:
        asked = [(j.extra or {}).get(ASKED) for j in evaluation.results]
        if not any(isinstance(a, dict) and a.get(DISTRIBUTION_ONLY) for a in asked):
            return evaluation.images
    return None


def end_evaluation_of(run: Run) -> EndEvaluation | None:
    """What the run's training job evaluates at its end, or None (not a deciding grid's, a command arm or an arm
    on several GPUs, nothing past its training records' images, or the grid's looks evaluate other images)."""
    grid = run.grid
    decide = decide_of(grid) if grid is not None else None
    if decide is None:
        return None
    try:
        spec = ArmSpec.model_validate(run.spec)
    except ValueError:
        return None
    if spec.command is not None or spec.gpu_count() != 1:
        return None
    split = min((held_out_size(r) for r in grid.runs if not (r.spec or {}).get("command")), default=0)
    images = min(decide.max_images or split, split)  # a look's max_images (decider.py look_state)
    if images <= spec.eval.num_samples:
        return None
    largest = _largest_images(object_session(run), grid)
    if largest is not None and largest != images:
        return None
    measures = measures_of(decide)
    return EndEvaluation(images=images, measures=list(measures) if flow_only(measures) else None)


def split_off(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]]]:
    """The records without what their in-training evaluation said (never part of a Metric row), and that,
    per step: {IN_TRAINING_RECORD: its record} or {IN_TRAINING_ERROR: why it failed}."""
    kept, said = [], {}
    for record in records:
        found = {k: record[k] for k in (IN_TRAINING_RECORD, IN_TRAINING_ERROR) if k in record}
        if found:
            said[int(record["step"])] = found
            record = {k: v for k, v in record.items() if k not in found}
        kept.append(record)
    return kept, said
