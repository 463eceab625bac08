"""What a run will cost, for the night planner: the product's own measured speed where it has one, else the
FLOP-based estimate (grids/replicates.py projected_gpu_hours), and which of the two each number is.

- Measured rate: the steps per second of earlier runs of the same arm key (the spec's training content:
  model, data, optimizer, schedule shape; not its seed, steps, GPUs or detector) on the same GPU model,
  at steady state (the median of a run's records after its first, which carries the compile).
- Scaling: where a run of an arm key on 2 or 4 GPUs has a 1-GPU twin of the same key and GPU model, its
  rate over the twin's; per GPU count, the median over arm keys. Unmeasured counts use the planner's
  default (0.98 per doubling).
"""

from __future__ import annotations

import hashlib
import json
import statistics
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from model.spec import ArmSpec
from orchestrator.grids.replicates import projected_gpu_hours

MEASURED = "measured"  # from this product's own records of the arm key on the GPU model
ESTIMATED = "estimated"  # from FLOPs at arm A's reference rate (replicates.py)
GIVEN = "given"  # a what-if: `ablate plan --hours`


def arm_key(spec: ArmSpec) -> str:
    """What decides an arm's speed per step, as a short hash: the spec without its seeds, steps, GPUs,
    checkpoint cadence, evaluation, detector and names."""
    body = spec.model_dump(mode="json")
    for name in ("name", "parent", "description", "detector", "eval", "gpus"):
        body.pop(name, None)
    body["data"] = {k: v for k, v in body["data"].items() if k not in ("seed", "split_seed")}
    body["schedule"] = {k: v for k, v in body["schedule"].items() if k not in ("steps", "checkpoint_every")}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Rates:
    """Steady-state steps per second by (arm key, GPUs) on one GPU model, and the scaling they imply."""

    gpu_model: str | None
    steps_per_s: dict[tuple[str, int], float]

    def scaling(self) -> dict[int, float]:
        """GPUs -> measured speedup over one GPU, the median over arm keys with a 1-GPU twin."""
        ratios: dict[int, list[float]] = {}
        for (key, gpus), rate in self.steps_per_s.items():
            single = self.steps_per_s.get((key, 1))
            if gpus > 1 and single:
                ratios.setdefault(gpus, []).append(rate / single)
        return {gpus: statistics.median(found) for gpus, found in sorted(ratios.items())}


def measured_rates(session: Session, gpu_model: str | None) -> Rates:
    """The rates of every finished or running built-in run on `gpu_model` (None: the most common GPU
    model the runs record), each the median of its records' iter/s after the first."""
    from orchestrator.db.models import Metric, Run

    if gpu_model is None:
        names = [n for n in session.scalars(select(Run.gpu_name).where(Run.gpu_name.is_not(None)))]
        gpu_model = max(set(names), key=names.count) if names else None
    if gpu_model is None:
        return Rates(None, {})
    rows = session.execute(
        select(Run.id, Run.spec, Metric.iter_per_sec, Metric.extra["ranks"].as_integer())
        .join(Metric, Metric.run_id == Run.id)
        .where(Run.gpu_name == gpu_model, Metric.iter_per_sec.is_not(None))
        .order_by(Run.id, Metric.step)
    ).all()
    # Per run and GPU count: a run grown onto more GPUs (runs/grow.py) has records at each count, its
    # records' `ranks` says which (older records name none: the spec's count).
    per_run: dict[tuple[int, int], tuple[ArmSpec, list[float]]] = {}
    specs: dict[int, ArmSpec | None] = {}
    for run_id, spec, rate, ranks in rows:
        if run_id not in specs:
            specs[run_id] = _built_in(spec)
        parsed = specs[run_id]
        if parsed is None:
            continue
        per_run.setdefault((run_id, ranks or parsed.gpu_count()), (parsed, []))[1].append(float(rate))
    found: dict[tuple[str, int], list[float]] = {}
    for (_, gpus), (spec, rates) in per_run.items():
        steady = rates[1:] or rates  # the first record of each count carries its (re)start
        found.setdefault((arm_key(spec), gpus), []).append(statistics.median(steady))
    return Rates(gpu_model, {key: statistics.median(v) for key, v in found.items()})


def _built_in(spec: dict) -> ArmSpec | None:  # type: ignore[type-arg]
    try:
        parsed = ArmSpec.model_validate(spec)
    except ValueError:  # a row from before a spec field changed: not comparable
        return None
    return parsed if parsed.command is None else None


@dataclass(frozen=True)
class Projection:
    hours: float | None  # on one GPU; None: a command arm, which nothing projects
    source: str  # MEASURED | ESTIMATED | GIVEN


def project(spec: ArmSpec, rates: Rates) -> Projection:
    """One run's single-GPU hours: measured where the arm key ran on one GPU of this model (or on several,
    divided by the measured speedup), else the FLOP estimate."""
    if spec.command is not None:
        return Projection(None, ESTIMATED)
    key = arm_key(spec)
    single = rates.steps_per_s.get((key, 1))
    if single is None:
        scaling = rates.scaling()
        for (k, gpus), rate in sorted(rates.steps_per_s.items()):
            if k == key and gpus in scaling:
                single = rate / scaling[gpus]
                break
    if single:
        return Projection(spec.schedule.steps / single / 3600, MEASURED)
    return Projection(projected_gpu_hours(spec), ESTIMATED)
