"""What a run will cost, for the night planner: the product's own measured speed where it has one, else the
FLOP-based estimate (grids/replicates.py projected_gpu_hours), and which of the two each number is.

- Measured rate: the steps per second of earlier runs of the same arm key (the spec's training content:
  model, data, optimizer, schedule shape; not its seed, steps, GPUs or detector) on the same GPU model,
  at steady state (the median of a run's records after its first, which carries the compile).
- Fixed cost: what a run pays whatever its GPUs: starting and compiling, then an evaluation at every
  checkpoint. Measured from the same runs (a run's wall time at its last record less its steps at the steady
  rate, the evaluations' own timings split out), else estimated: START_S, and an evaluation's forward passes
  at a third of a training step's cost per image at the reference rate.
- Distribution passes (eval.distribution): priced apart from the fixed cost's evaluations, since they run only
  at every k-th checkpoint and their price grows with the samples. Measured: seconds per generated sample from
  the `distribution_seconds` of earlier records of the same arm key and pass settings, times the samples; else
  the FLOP estimate (grids/distribution_price.py). A run pays them whatever its GPUs (in its fixed hours).
- Scaling: where a run of an arm key on 2 or 4 GPUs has a 1-GPU twin of the same key and GPU model, its
  rate over the twin's; per GPU count, the median over arm keys. Unmeasured counts use the planner's
  default (0.98 per doubling).
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.orm import Session

from model.spec import ArmSpec
from orchestrator.grids.distribution_price import distribution_passes, estimated_distribution_seconds
from orchestrator.grids.replicates import projected_gpu_hours, tokens_per_image, tokens_per_s_of

MEASURED = "measured"  # from this product's own records of the arm key on the GPU model
ESTIMATED = "estimated"  # from FLOPs at arm A's reference rate (replicates.py)
GIVEN = "given"  # a what-if: `ablate plan --hours`
# A run's start before its first step, estimated: the process, the data, and a cold compile (55-60 s on an
# H200 at seed size, docs/benchmarks.md; 17 s from the stored compile cache) where it compiles.
START_S = {True: 60.0, False: 15.0}
SAMPLER_PASSES = 4  # an evaluation generates each held-out image 4 times (recon, text-only, an edit pair)
FLOW_TIMES = 8  # and scores the flow loss at 8 fixed times (model/evaluate.py); a flow-only one, only this


def arm_key(spec: ArmSpec) -> str:
    """What decides an arm's speed per step, as a short hash: the spec without its seeds, steps, GPUs,
    checkpoint cadence, evaluation, detector and names."""
    body = spec.model_dump(mode="json")
    for name in ("name", "parent", "description", "detector", "eval", "gpus"):
        body.pop(name, None)
    body["data"] = {k: v for k, v in body["data"].items() if k not in ("seed", "split_seed")}
    body["schedule"] = {k: v for k, v in body["schedule"].items() if k not in ("steps", "checkpoint_every")}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def distribution_key(spec: ArmSpec) -> str:
    """What decides a distribution pass's seconds per generated sample: the arm key (its model and images), the
    metrics (their extractors) and the sampler; not the samples, which the price multiplies by."""
    dist = spec.eval.distribution
    body = [arm_key(spec), sorted(dist.metrics), dist.sampler_steps, dist.guidance]
    return hashlib.sha256(json.dumps(body).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Rates:
    """Steady-state steps per second by (arm key, GPUs) on one GPU model, and the scaling they imply."""

    gpu_model: str | None
    steps_per_s: dict[tuple[str, int], float]
    # arm key -> (start seconds, seconds per evaluation), measured
    fixed_s: dict[str, tuple[float, float]] = field(default_factory=dict)
    # distribution key -> a distribution pass's seconds per generated sample, measured
    distribution_s: dict[str, float] = field(default_factory=dict)

    def scaling(self) -> dict[int, float]:
        """GPUs -> measured speedup over one GPU, the median over arm keys with a 1-GPU twin."""
        ratios: dict[int, list[float]] = {}
        for (key, gpus), rate in self.steps_per_s.items():
            single = self.steps_per_s.get((key, 1))
            if gpus > 1 and single:
                ratios.setdefault(gpus, []).append(rate / single)
        return {gpus: statistics.median(found) for gpus, found in sorted(ratios.items())}


class MeasuredRate(BaseModel):
    arm_key: str
    gpus: int
    steps_per_s: float


class RatesPublic(BaseModel):
    """Rates over JSON (GET /api/rates, which `ablate plan` reads): the dict keyed by (arm key, GPUs) as rows."""

    gpu_model: str | None
    steps_per_s: list[MeasuredRate]
    fixed_s: dict[str, tuple[float, float]]
    distribution_s: dict[str, float]

    @classmethod
    def of(cls, rates: Rates) -> RatesPublic:
        rows = [MeasuredRate(arm_key=k, gpus=g, steps_per_s=v) for (k, g), v in sorted(rates.steps_per_s.items())]
        return cls(gpu_model=rates.gpu_model, steps_per_s=rows, fixed_s=rates.fixed_s,
                   distribution_s=rates.distribution_s)

    def rates(self) -> Rates:
        return Rates(self.gpu_model, {(r.arm_key, r.gpus): r.steps_per_s for r in self.steps_per_s},
                     dict(self.fixed_s), dict(self.distribution_s))


def measured_rates(session: Session, gpu_model: str | None) -> Rates:
    """The rates of every finished or running built-in run on `gpu_model` (None: the most common GPU
    model the runs record), each the median of its records' iter/s after the first; and each arm key's
    fixed cost, from the runs that never resumed (a resume restarts the wall clock)."""
    from orchestrator.db.models import Metric, Run

    if gpu_model is None:
        names = [n for n in session.scalars(select(Run.gpu_name).where(Run.gpu_name.is_not(None)))]
        gpu_model = max(set(names), key=names.count) if names else None
    if gpu_model is None:
        return Rates(None, {})
    rows = session.execute(
        select(Run.id, Run.spec, Metric.iter_per_sec, Metric.extra["ranks"], Metric.step,
               Metric.wall_time_s, Metric.extra["eval_time_s"], Metric.extra["resumed_from_step"],
               Metric.extra["distribution_seconds"])
        .join(Metric, Metric.run_id == Run.id)
        .where(Run.gpu_name == gpu_model, Metric.iter_per_sec.is_not(None))
        .order_by(Run.id, Metric.step)
    ).all()
    # Per run and GPU count: a run grown onto more GPUs (runs/grow.py) has records at each count. The count
    # is the controller's (placed_gpus); a record's `ranks` is a node's claim, read as JSON and never cast
    # in SQL (Postgres failed every later plan on a "4.5"; so with eval_time_s and resumed_from_step, read
    # as numbers here), and a record whose claim disagrees is left out: these rates project every later
    # grid's runs.
    growths = _growths(session, {row[0] for row in rows})
    per_run: dict[tuple[int, int], tuple[ArmSpec, list[Any]]] = {}
    specs: dict[int, ArmSpec | None] = {}
    for run_id, spec, rate, ranks, *record in rows:
        if run_id not in specs:
            specs[run_id] = _built_in(spec)
        parsed = specs[run_id]
        if parsed is None:
            continue
        gpus = placed_gpus(growths.get(run_id, []), record[0], parsed.gpu_count())
        if ranks is not None and ranks != gpus or isinstance(ranks, bool):
            continue
        step, wall, eval_s, resumed, dist_s = record
        per_run.setdefault((run_id, gpus), (parsed, []))[1].append((float(rate), step, wall, _number(eval_s),
                                                                     _number(resumed), _number(dist_s)))  # fmt: skip
    found: dict[tuple[str, int], list[float]] = {}
    fixed: dict[str, list[tuple[float, float]]] = {}
    per_sample: dict[str, list[float]] = {}
    for (_, gpus), (spec, records) in per_run.items():
        steady = statistics.median(r[0] for r in (records[1:] or records))  # the first carries its (re)start
        key = arm_key(spec)
        found.setdefault((key, gpus), []).append(steady)
        passes = [r[5] for r in records if r[5] is not None]  # the distribution passes' seconds, where they ran
        if passes and spec.eval.distribution.samples:
            per_sample.setdefault(distribution_key(spec), []).append(
                statistics.median(passes) / spec.eval.distribution.samples)
        # the fixed cost from runs that never resumed (a resume, a growth too, restarts the wall clock)
        evals = [r[3] for r in records if r[3] is not None]
        step, wall = records[-1][1], records[-1][2]
        if evals and wall is not None and steady > 0 and not any(r[4] for r in records):
            eval_s = statistics.median(evals)
            start = wall - step / steady - len(records) * eval_s - sum(passes)  # the passes are priced apart
            fixed.setdefault(key, []).append((max(start, 0.0), eval_s))
    return Rates(
        gpu_model,
        {key: statistics.median(v) for key, v in found.items()},
        {key: (statistics.median(s for s, _ in v), statistics.median(e for _, e in v)) for key, v in fixed.items()},
        {key: statistics.median(v) for key, v in per_sample.items()},
    )


def _number(value: Any) -> float | None:  # noqa: ANN401 - a record's JSON value
    """A finite number of a record's extra, else None (a node may have put any JSON there)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _growths(session: Session, run_ids: set[int]) -> dict[int, list[tuple[int, int]]]:
    """Per run, (step, GPUs before) of each growth the controller recorded (runs/grow.py), by step."""
    from orchestrator.db.models import Event
    from orchestrator.vocabulary import GROWN

    out: dict[int, list[tuple[int, int]]] = {}
    if not run_ids:
        return out
    for run_id, data in session.execute(select(Event.run_id, Event.data).where(
            Event.run_id.in_(run_ids), Event.kind == GROWN)):  # fmt: skip
        step, before = (data or {}).get("step"), (data or {}).get("from_gpus")
        if isinstance(step, int) and isinstance(before, int):
            out.setdefault(run_id, []).append((step, before))
    return {run_id: sorted(found) for run_id, found in out.items()}


def placed_gpus(growths: list[tuple[int, int]], step: int, gpus: int) -> int:
    """The GPUs the controller gave the attempt that wrote the record of `step`: the count before the first
    growth at or after it (records up to a growth's step came before it), else the spec's (`gpus`, which a
    growth raises)."""
    return next((before for at, before in growths if step <= at), gpus)


def _built_in(spec: dict) -> ArmSpec | None:  # type: ignore[type-arg]
    try:
        parsed = ArmSpec.model_validate(spec)
    except ValueError:  # a row from before a spec field changed: not comparable
        return None
    return parsed if parsed.command is None else None


@dataclass(frozen=True)
class Projection:
    hours: float | None  # of training on one GPU; None: a command arm, which nothing projects
    source: str  # MEASURED | ESTIMATED | GIVEN
    fixed_hours: float = 0.0  # what the run pays whatever its GPUs: start, compile, evaluations, distribution passes
    fixed_source: str = ESTIMATED
    distribution_hours: float = 0.0  # the distribution passes' part of fixed_hours
    distribution_source: str = ESTIMATED


def project(spec: ArmSpec, rates: Rates) -> Projection:
    """One run's single-GPU hours: measured where the arm key ran on one GPU of this model (or on several,
    divided by the measured speedup), else the FLOP estimate; and its fixed cost (its distribution passes in it),
    likewise."""
    if spec.command is not None:
        return Projection(None, ESTIMATED)
    key = arm_key(spec)
    fixed_h, fixed_source = fixed_cost(spec, rates.fixed_s.get(key))
    dist_h, dist_source = distribution_cost(spec, rates.distribution_s.get(distribution_key(spec)))
    single = rates.steps_per_s.get((key, 1))
    if single is None:
        scaling = rates.scaling()
        for (k, gpus), rate in sorted(rates.steps_per_s.items()):
            if k == key and gpus in scaling:
                single = rate / scaling[gpus]
                break
    if single:
        return Projection(spec.schedule.steps / single / 3600, MEASURED, fixed_h + dist_h, fixed_source, dist_h,
                          dist_source)  # fmt: skip
    return Projection(projected_gpu_hours(spec), ESTIMATED, fixed_h + dist_h, fixed_source, dist_h, dist_source)


def distribution_cost(spec: ArmSpec, seconds_per_sample: float | None) -> tuple[float, str]:
    """A run's distribution passes in hours: measured seconds per generated sample (earlier passes of the same
    distribution key) times the samples of each pass, else the FLOP estimate (grids/distribution_price.py)."""
    passes = distribution_passes(spec)
    if passes and seconds_per_sample is not None:
        return passes * spec.eval.distribution.samples * seconds_per_sample / 3600, MEASURED
    return estimated_distribution_seconds(spec) / 3600, ESTIMATED


def fixed_cost(spec: ArmSpec, measured: tuple[float, float] | None) -> tuple[float, str]:
    """A run's start plus an evaluation at each checkpoint (every checkpoint_every steps and the last), in
    hours: measured where the arm key has run here, else estimated."""
    evaluations = math.ceil(spec.schedule.steps / spec.schedule.checkpoint_every)
    if measured is not None:
        start_s, eval_s = measured
        return (start_s + evaluations * eval_s) / 3600, MEASURED
    compiles = spec.precision.compile is not False  # None: on for CUDA, where the night runs
    eval_s = evaluation_pass_seconds(spec, spec.eval.num_samples)
    return (START_S[compiles] + evaluations * eval_s) / 3600, ESTIMATED


def image_passes(spec: ArmSpec, flow_only: bool = False) -> int:
    """Forward passes an evaluation spends on one held-out image: the LPIPS metrics' sampling and the flow
    loss's times, or (flow_only: an evaluation that measures the flow loss alone) the flow loss's times."""
    return FLOW_TIMES if flow_only else SAMPLER_PASSES * spec.eval.sampler_steps + FLOW_TIMES


def evaluation_pass_seconds(spec: ArmSpec, images: int, flow_only: bool = False) -> float:
    """One evaluation pass over `images` held-out images, estimated from FLOPs (a forward pass: about a
    third of a training step's), without the job's start."""
    return images * image_passes(spec, flow_only) * tokens_per_image(spec) / 3 / tokens_per_s_of(spec)
