"""A grid that decides: `decide` in place of `seeds`. Every arm starts with `min_seeds` training seeds;
after each wave the controller looks at every comparison's crossed interval against a group-sequential
boundary (orchestrator/results/deciding/sequential.py) and adds work only where a comparison is still open: one
more seed of both arms, or an evaluation of more held-out images (orchestrator/results/deciding/decider.py).

This module is the grid's side: the body's `decide` checked, and the runs of one more seed of an arm,
queued like the grid's first ones (seed-major, the same held-out split: grids/replicates.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from model.flow_headline import HEADLINE
from model.spec import ArmSpec
from orchestrator.db.models import Grid, Run
from orchestrator.grids.evaluations import EVERY_METRIC, FLOW_METRICS, flow_only
from orchestrator.grids.projection import START_S, Rates, evaluation_pass_seconds, image_passes, project
from orchestrator.grids.replicates import MAX_SEEDS, replicate_spec
from orchestrator.vocabulary import RunState

# The metrics a decision may be taken on: the report's compared metrics (results/reports/build.py
# COMPARED; a test holds the two equal) with per-sample values, so their differences have a crossed interval.
DECIDABLE_METRICS = (HEADLINE, "val_flow_loss", "recon_lpips", "text_lpips", "text_manip_delta", "cmmd", "dino_mmd")
# Distribution metrics the report shows but no decision may be taken on, and why.
UNDECIDABLE_METRICS = {
    "fd_dinov2": "a Fréchet distance has no per-sample contributions, so no crossed seeds x images interval",
    "fid": "FID is descriptive: its small-n bias depends on the model, and it has no per-sample contributions",
}
DEFAULT_MARGIN = {HEADLINE: 0.0}
FLOW_DECIDED = (HEADLINE, "val_flow_loss")  # decided metrics an evaluation of the flow loss alone measures
# The error rate alpha holds: each comparison's chance of a wrong call, or (familywise) the chance of any wrong
# call among the grid's comparisons, each then spending alpha/m (results/deciding/sequential.py comparison_alpha;
# its ErrorRate, which a test holds equal to this one).
ErrorRate = Literal["per-comparison", "familywise"]
MAX_BORROW = 20  # earlier grids a deciding grid may borrow seed variances from
MAX_GRID_ID = 2**31 - 1  # a database id (web/deps.py MAX_ID): a larger one never reaches the query
AUTO = "auto"  # borrow_from: earlier grids of the same arms, code, data and images (results/deciding/borrowing.py)
BorrowIds = Annotated[list[Annotated[int, Field(ge=1, le=MAX_GRID_ID)]], Field(max_length=MAX_BORROW)]
BorrowFrom = Literal["auto"] | BorrowIds
_BORROW_IDS: TypeAdapter[list[int]] = TypeAdapter(BorrowIds)
BORROW_CHECK = 0.1  # results/deciding/borrowed.py CHECK (grids/ does not import results/; a test holds the two equal)
IMAGE_STEP = 4  # results/deciding/sequential.py IMAGE_STEP: an images action asks this many times the images
MAX_LOOKS = 100  # the most looks (and evaluations) a grid may be allowed
MAX_GPU_HOURS = 1e7
ESTIMATE = Rates(gpu_model=None, steps_per_s={})  # no measured rate: the same projection wherever it is read


class DecideSpec(BaseModel):
    """How a deciding grid spends seeds and images: the error rate alpha (held over every look; per
    comparison, or familywise over the grid's comparisons: error_rate), the seeds every arm starts with and
    may reach, the held-out images an evaluation may reach (None: the whole split), when a hopeless
    comparison stops early (futility), per decided metric the equivalence margin (0: no equivalence
    verdict), and the earlier grids each arm's seed variance may be borrowed from (borrow_from, with its
    check)."""

    model_config = ConfigDict(extra="forbid")

    alpha: Annotated[float, Field(gt=0, lt=0.5, examples=[0.05])] = 0.05
    error_rate: ErrorRate = "per-comparison"
    min_seeds: Annotated[int, Field(ge=1, le=MAX_SEEDS)] = 2
    max_seeds: Annotated[int, Field(ge=1, le=MAX_SEEDS)] = 8
    max_images: Annotated[int, Field(ge=1, le=100_000)] | None = None
    # Close an open comparison undecided once its conditional power at the budget falls below this (non-
    # binding: it never adds a wrong call); None: the maths' default (results/deciding/sequential.py FUTILITY), 0: off.
    futility: Annotated[float, Field(ge=0, lt=1)] | None = None
    margin: dict[str, Annotated[float, Field(ge=0, allow_inf_nan=False)]] = Field(
        default_factory=lambda: dict(DEFAULT_MARGIN), min_length=1, max_length=len(DECIDABLE_METRICS)
    )
    # Earlier grids whose runs of the same arms (the same spec but the training seed) lend each arm its seed
    # variance (results/deciding/borrowing.py), only from records of trusted nodes; "auto": the earlier grids whose
    # runs also ran the same code on the same data and images, found at each look; empty: its own seeds alone.
    borrow_from: BorrowFrom = Field(default_factory=list)
    # The borrowed variance's check (results/deciding/borrowed.py `seed_reading`): a comparison whose own seeds spread
    # past the borrowed variance's upper F bound at this level reads its own alone.
    check: Annotated[float, Field(gt=0, lt=0.5)] = BORROW_CHECK
    # The spend no look queues work past: the grid's runs' and evaluation jobs' measured GPU-hours and the
    # next action's price (results/deciding/decider.py). None at submit: the worst case the submit shows
    # (worst_case_gpu_hours), stored with the grid; still None where that cannot be projected (command arms).
    max_gpu_hours: Annotated[float, Field(gt=0, le=MAX_GPU_HOURS, allow_inf_nan=False)] | None = None
    # Looks, and evaluations (images actions and catch-ups), a grid may take; None at submit: what max_seeds
    # and the images steps need (default_looks), stored with the grid.
    max_looks: Annotated[int, Field(ge=1, le=MAX_LOOKS)] | None = None
    max_evaluations: Annotated[int, Field(ge=0, le=MAX_LOOKS)] | None = None

    @field_validator("margin")
    @classmethod
    def _known_metrics(cls, v: dict[str, float]) -> dict[str, float]:
        for metric in sorted(set(v) & set(UNDECIDABLE_METRICS)):
            raise ValueError(f"decide.margin names {metric!r}, which cannot be decided: {UNDECIDABLE_METRICS[metric]}; "
                             "decide on cmmd or dino_mmd (their per-sample MMD values pair across arms)")  # fmt: skip
        unknown = sorted(set(v) - set(DECIDABLE_METRICS))
        if unknown:
            raise ValueError(f"unknown metric {', '.join(map(repr, unknown))}: a margin names one of "
                             f"{', '.join(DECIDABLE_METRICS)}")  # fmt: skip
        return v

    @field_validator("borrow_from", mode="plain", json_schema_input_type=BorrowFrom)
    @classmethod
    def _auto_or_distinct_grids(cls, v: object) -> list[int] | str:
        # By hand, not as a union: a bad id is then one error at its own path, not one per member of the union.
        if v == AUTO:
            return AUTO
        if isinstance(v, str):
            raise ValueError(f'{v!r}: borrow_from is "auto" or a list of earlier grid ids')
        v = _BORROW_IDS.validate_python(v)
        twice = sorted({g for g in v if v.count(g) > 1})
        if twice:
            raise ValueError(f"grid {', '.join(map(str, twice))} named twice: name each earlier grid once")
        return v

    @model_validator(mode="after")
    def _seeds_in_order(self) -> DecideSpec:
        if self.min_seeds > self.max_seeds:
            raise ValueError(f"min_seeds ({self.min_seeds}) must be at most max_seeds ({self.max_seeds})")
        return self


DECIDE_WITH_SEEDS = ("`decide` and `seeds` cannot both be given: a deciding grid starts every arm with "
                     "decide.min_seeds and adds seeds itself; drop `seeds` (or drop `decide` for a fixed "
                     "number of seeds)")  # fmt: skip


def borrow_errors(session: Session, decide: DecideSpec | None) -> list[dict[str, Any]]:
    """A grid body's decide.borrow_from ids that name no stored grid, each with its path in the body ("auto"
    names none: the grids are found at each look)."""
    ids = decide.borrow_from if decide is not None and isinstance(decide.borrow_from, list) else []
    stored = set(session.scalars(select(Grid.id).where(Grid.id.in_(ids)))) if ids else set()
    return [{"loc": ["decide", "borrow_from", i], "type": "value_error",
             "msg": f"no grid {g}: borrow_from names earlier grids by id (`ablate status` lists them); drop it "
                    "or give the id of a stored grid that ran the same arms"}
            for i, g in enumerate(ids) if g not in stored]  # fmt: skip


def decide_of(grid: Grid) -> DecideSpec | None:
    """The grid's stored `decide`, or None for a grid with a fixed number of seeds."""
    return DecideSpec.model_validate(grid.decide) if grid.decide else None


def arm_seeds(grid: Grid) -> dict[str, int]:
    """How many seeds each arm of the grid has (queued or run), in the grid's arm order."""
    seeds: dict[str, int] = {}
    for r in grid.runs:
        seeds[r.arm] = max(seeds.get(r.arm, 0), r.seed + 1)
    return seeds


def add_seed(grid: Grid, arms: list[str]) -> list[Run]:
    """Queue one more seed of each of `arms` (the next seed index of each, the same held-out split), after
    every run the grid has; returns the new runs (the caller flushes and commits)."""
    first = {r.arm: r for r in grid.runs if r.seed == 0}
    seeds = arm_seeds(grid)
    position = max((r.position for r in grid.runs), default=-1) + 1
    added = []
    for arm in arms:
        seed = seeds[arm]
        spec = replicate_spec(ArmSpec.model_validate(first[arm].spec), seed).model_dump(mode="json")
        run = Run(position=position, arm=arm, seed=seed, spec=spec, state=RunState.queued)
        grid.runs.append(run)
        added.append(run)
        position += 1
    grid.seeds = max(arm_seeds(grid).values())
    return added


def worst_case_runs(arms: int, decide: DecideSpec) -> int:
    """Runs if every comparison stays open to the budget: every arm at max_seeds."""
    return arms * decide.max_seeds


def submitted_pairs(arms: Sequence[tuple[str, ArmSpec]], control: str | None) -> list[tuple[str, str]]:
    """(arm, comparator) of every comparison a grid's report will hold: each arm against its parent and
    against the control (results/reports/build.py Pairing, at one seed)."""
    labels = [label for label, _ in arms]
    control = control or (labels[0] if labels else None)
    pairs = []
    for label, spec in arms:
        parent = spec.parent if spec.parent in labels and spec.parent != label else None
        if parent is not None:
            pairs.append((label, parent))
        if control is not None and control not in (label, parent):
            pairs.append((label, control))
    return pairs


def family_size(arms: Sequence[tuple[str, ArmSpec]], control: str | None, decide: DecideSpec) -> int:
    """m, the comparisons a familywise alpha is split over: every submitted comparison on every decided metric.
    Fixed at submit, so no look's alpha moves when a run fails or a metric is not measured (conservative)."""
    return max(len(submitted_pairs(arms, control)) * len(decide.margin), 1)


def images_range(specs: Sequence[ArmSpec], decide: DecideSpec) -> tuple[int, int]:
    """(the images the training records measure, the most an evaluation may ask for): every arm's
    eval.num_samples, and decide.max_images, within the smallest held-out split."""
    split = min((s.data.held_out for s in specs), default=1) or 1
    first = min((min(s.eval.num_samples, s.data.held_out) for s in specs), default=1) or 1
    return first, max(min(decide.max_images or split, split), first)


def images_asked(first: int, most: int) -> list[int]:
    """The images each images action asks for, from the training records' `first` to `most`."""
    asked, n = [], max(first, 1)
    while n < most:
        n = min(most, IMAGE_STEP * n)
        asked.append(n)
    return asked


def default_looks(decide: DecideSpec, specs: Sequence[ArmSpec]) -> tuple[int, int]:
    """(looks, evaluations) a grid needs to reach its budget: a look per images step and per seed of an arm
    and of its comparator, and the last; an evaluation per images step and a catch-up after each seed."""
    steps = len(images_asked(*images_range(specs, decide)))
    seeds = 2 * (decide.max_seeds - decide.min_seeds)
    return min(1 + steps + seeds, MAX_LOOKS), min(steps + seeds, MAX_LOOKS)


def measures_of(decide: DecideSpec | None) -> tuple[str, ...]:
    """The per-image metrics a look's evaluation measures: the flow loss alone where every metric the grid
    decides on (decide.margin) is the flow loss's (val_flow_ivw, val_flow_loss), which skips the LPIPS
    metrics' sampling, most of an evaluation's cost; else every one (grids/evaluations.py EVERY_METRIC)."""
    if decide is not None and set(decide.margin) <= set(FLOW_DECIDED):
        return FLOW_METRICS
    return EVERY_METRIC


def image_share(spec: ArmSpec, measures: Sequence[str]) -> float:
    """What an image of an evaluation measuring `measures` costs, as a share of one measuring every metric
    (a training checkpoint's evaluation, whose measured pass prices an image): its forward passes' ratio."""
    return image_passes(spec, flow_only(measures)) / image_passes(spec)


def evaluation_job_hours(spec: ArmSpec, images: int, measures: Sequence[str] = EVERY_METRIC) -> float:
    """One run's evaluation job on `images` held-out images measuring `measures`, estimated as the planner
    prices a checkpoint's evaluation (grids/projection.py fixed_cost: a start, then one evaluation pass of the
    sampler's and the flow loss's forward passes, or the flow loss's alone)."""
    start = START_S[spec.precision.compile is not False]
    return (start + evaluation_pass_seconds(spec, images, flow_only=flow_only(measures))) / 3600


def worst_case_gpu_hours(arms: Sequence[tuple[str, ArmSpec]], control: str | None,
                         decide: DecideSpec) -> float | None:  # fmt: skip
    """Every comparison open to its budget: each arm in a comparison trained max_seeds times (the FLOP
    estimate at an H100's rate with its start and checkpoint evaluations: grids/projection.py), each run
    evaluated at every images step to max_images and once more there (a seed added after an evaluation).
    The same number wherever it is computed (no measured rate). None where an arm cannot be projected."""
    specs = dict(arms)
    asked = images_asked(*images_range(list(specs.values()), decide))
    total = 0.0
    for label in {a for pair in submitted_pairs(arms, control) for a in pair}:
        run = project(specs[label], ESTIMATE)
        if run.hours is None:
            return None
        evaluations = sum(evaluation_job_hours(specs[label], n, measures_of(decide)) for n in [*asked, *asked[-1:]])
        total += decide.max_seeds * (run.hours + run.fixed_hours + evaluations)
    return total if math.isfinite(total) else None


def with_budget(decide: DecideSpec, arms: Sequence[tuple[str, ArmSpec]], control: str | None) -> DecideSpec:
    """The grid's decide with the budget it did not name: max_gpu_hours the worst case, max_looks and
    max_evaluations what its seeds and images steps need (stored with the grid at submit)."""
    looks, evaluations = default_looks(decide, [spec for _, spec in arms])
    hours = decide.max_gpu_hours if decide.max_gpu_hours is not None else worst_case_gpu_hours(arms, control, decide)
    return decide.model_copy(update={
        "max_gpu_hours": min(hours, MAX_GPU_HOURS) if hours is not None and hours > 0 else None,
        "max_looks": decide.max_looks if decide.max_looks is not None else looks,
        "max_evaluations": decide.max_evaluations if decide.max_evaluations is not None else evaluations})  # fmt: skip


def dump(decide: DecideSpec | None) -> dict[str, Any] | None:
    return decide.model_dump(mode="json") if decide is not None else None
