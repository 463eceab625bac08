"""What an evaluation job's record must be before it is stored, and the cost it is stored with.

A job's record (worker/evaluation.py) is a node's claim like a training record. Beyond the protocol and
the metric ranges (runs/ingest.py), it must measure the checkpoint asked for on the images asked for:
each metric it sets counts one row per image asked (`<metric>_n`, and its per-image lists as long), less
the held-out images the node names unreadable in `skipped_files`, each one the run's own training records
already named (its fallbacks). Anything else refuses the record: a node answering 15 rows of 16 would
otherwise have the evaluation asked for again and again, and its values stand for 16 images.

Distribution metrics asked for (the job's `extra["asked"]`: samples and metrics) must each be there with
`<metric>_n` equal to the samples asked, a finite value and SE, an extractor label, and (CMMD, DINO-MMD) as many
finite per-sample values as samples, whose mean is the value: a node cannot claim a CMMD its samples do not give.
An MMD's per-reference values (`<metric>_per_reference`), where sent, are at least 3 finite numbers (their count
bounded by the protocol); a record from a node before them is stored without, and its effects leave the
reference's noise out as they always did.

The wall time it claims is its cost (the decider prices an images action from it), so it is bounded by
what the controller saw: the time from the job's placement to its record.
"""

from __future__ import annotations

import math
from typing import Any

from model.spec import REFERENCE_SUFFIX
from orchestrator.db.models import EvaluationResult, aware, utcnow
from orchestrator.grids.evaluations import ASKED, EVERY_METRIC, flow_only, measured_by
from orchestrator.numbers import is_finite
from orchestrator.vocabulary import RunDecision

JOB_GPUS = 1  # an evaluation is one process on one GPU, whatever the arm trained on
# The metrics an evaluation measures per held-out image (model/evaluate.py), each with `_n` and `_samples`.
PER_IMAGE_METRICS = EVERY_METRIC
MMD_METRICS = ("cmmd", "dino_mmd")  # distribution metrics with per-sample values (model/distribution_pass.py)
# Controller's own keys in a stored job's `extra`: the node's claimed wall time and the one it saw.
CLAIMED_KEY, SEEN_KEY = "wall_time_claimed_s", "wall_time_seen_s"


def unreadable_named_by_run(fallbacks: list[Any] | None) -> set[str]:
    """The images a run's own training records named unreadable: its fallback notes (the first few)."""
    from model.data.unreadable import fallback_note  # torch behind it: only when a record names any

    prefix = fallback_note("")
    return {f.removeprefix(prefix) for f in fallbacks or [] if isinstance(f, str) and f.startswith(prefix)}


def refused_rows(record: dict[str, Any], images: int, run_fallbacks: list[Any] | None,
                 measures: tuple[str, ...] = PER_IMAGE_METRICS) -> str | None:  # fmt: skip
    """Why `record` does not measure the `images` asked for, or None. `run_fallbacks`: the run's fallbacks.
    `measures`: the per-image metrics asked; where the LPIPS metrics were not (the flow loss alone), the flow
    loss must be measured and no LPIPS value may be claimed (it would stand for a sampling that was not asked)."""
    if flow_only(measures):
        claimed = [m for m in PER_IMAGE_METRICS if m not in measures and record.get(m) is not None]
        if claimed:
            return f"{', '.join(claimed)} on an evaluation that asked for {', '.join(measures)} alone"
        if record.get("val_flow_loss") is None:
            return f"no val_flow_loss on an evaluation that asked for {', '.join(measures)}"
    named = list(dict.fromkeys(record.get("skipped_files") or []))
    if named:
        unknown = [n for n in named if n not in unreadable_named_by_run(run_fallbacks)]
        if unknown:
            return (f"held-out images named unreadable that the run's own records never named: "
                    f"{', '.join(unknown[:3])}{' ...' if len(unknown) > 3 else ''}")  # fmt: skip
    expected = images - len(named)
    less = f" less the {len(named)} named unreadable" if named else ""
    asked = f"the {images} images asked for{less}"
    claimed = record.get("evaluated_images")
    if claimed is not None and claimed != images:
        return f"evaluated_images {claimed}, not {asked}"
    measured = False
    for metric in PER_IMAGE_METRICS:
        n = record.get(f"{metric}_n")
        if record.get(metric) is None and n is None:
            continue  # not measured: text_manip_delta on a dataset without caption edits
        if n != expected:
            return f"{metric}_n {n}, not {expected} rows for {asked}"
        samples = record.get(f"{metric}_samples")
        if samples is not None and len(samples) != expected:
            return f"{len(samples)} values in {metric}_samples, not {expected} for {asked}"
        measured = True
    grid = record.get("val_flow_loss_grid")
    if grid is not None and len(grid) != expected:
        return f"{len(grid)} rows in val_flow_loss_grid, not {expected} for {asked}"
    if not measured:
        return f"no metric measured on {asked}"
    return None


def distribution_asked(job: EvaluationResult) -> dict[str, Any]:
    """{"samples", "metrics"} the job was asked to measure, or {} (EvaluationArgs' fields)."""
    asked = (job.extra or {}).get(ASKED)
    return {"samples": asked["samples"], "metrics": list(asked["metrics"])} if isinstance(asked, dict) else {}


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and is_finite(x)


def refused_distribution(record: dict[str, Any], samples: int, metrics: list[str]) -> str | None:
    """Why `record` does not carry each asked distribution metric on `samples` samples, or None."""
    for metric in metrics:
        value, n, se = record.get(metric), record.get(f"{metric}_n"), record.get(f"{metric}_se")
        if n != samples:
            return f"{metric}_n {n}, not the {samples} samples asked for"
        if not _number(value) or not _number(se) or se < 0:
            return f"{metric} {value!r} with SE {se!r}: not a finite value and SE >= 0 on {samples} samples"
        if not isinstance(record.get(f"{metric}_extractor"), str):
            return f"{metric} without {metric}_extractor: every distribution value names its extractor"
        if metric in MMD_METRICS:
            per = record.get(f"{metric}_samples")
            if not isinstance(per, list) or len(per) != samples or not all(_number(x) for x in per):
                count = len(per) if isinstance(per, list) else 0
                return f"{count} finite values in {metric}_samples, not {samples} for the samples asked"
            if not math.isclose(sum(per) / samples, value, rel_tol=1e-6, abs_tol=1e-6):
                return f"{metric} {value:g} is not the mean of its {metric}_samples ({sum(per) / samples:g})"
            refs = record.get(f"{metric}{REFERENCE_SUFFIX}")
            if refs is not None and (not isinstance(refs, list) or len(refs) < 3 or not all(map(_number, refs))):
                return f"{metric}{REFERENCE_SUFFIX}: not a list of 3 or more finite values (one per reference image)"
    return None


def diverged_skip(job: EvaluationResult, record: dict[str, Any]) -> str | None:
    """Why the job is skipped rather than failed, or None: the detector stopped its run as diverged and the
    record measures a non-finite value (a diverged checkpoint's), which would otherwise fail every run's
    evaluation. The other runs are measured; the evaluation names this one as skipped."""
    run = job.run
    if run.decision != RunDecision.DIVERGED:
        return None
    keys = [*PER_IMAGE_METRICS, *(asked := distribution_asked(job)).get("metrics", [])]
    nonfinite = [f"{k} {record[k]}" for k in keys if k in record and record[k] is not None
                 and not (isinstance(record[k], int | float) and is_finite(record[k]))]  # fmt: skip
    nonfinite += [f"{k}_se {record[f'{k}_se']}" for k in asked.get("metrics", [])
                  if isinstance(record.get(f"{k}_se"), str)]  # fmt: skip
    if not nonfinite:
        return None
    return (f"run {run.id} diverged (the detector stopped it at step {run.decision_step}): its checkpoint of step "
            f"{job.step} measures {', '.join(nonfinite[:3])}; skipped, the other runs measured")


def refused_evaluation(job: EvaluationResult, record: dict[str, Any]) -> str | None:
    """Why a job's (protocol- and range-checked) record cannot be stored as its result, or None."""
    if record.get("step") != job.step:
        return f"a record of step {record.get('step')}, not the step {job.step} asked for"
    asked = distribution_asked(job)
    if asked and (why := refused_distribution(record, asked["samples"], asked["metrics"])) is not None:
        return why
    return refused_rows(record, job.evaluation.images, job.run.fallbacks, measured_by(job.evaluation))


def seen_seconds(job: EvaluationResult) -> float:
    """The seconds the controller saw the job's current attempt take: from its placement (its creation
    for a job placed before placements were timed) to now."""
    since = job.started_at or job.created_at
    return max(0.0, (utcnow() - aware(since)).total_seconds())


def bounded_wall_time(claimed: Any, seen: float) -> float:
    """The node's claimed seconds where they are a finite number within what the controller saw, else the
    controller's own `seen`: an inf, NaN or 1e29 never becomes a job's cost."""
    ok = isinstance(claimed, int | float) and not isinstance(claimed, bool) and math.isfinite(claimed)
    return float(claimed) if ok and 0 <= claimed <= seen else seen
