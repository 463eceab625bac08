"""A grid's night plan: its runs (arms x seeds) with their projected hours, the nodes' GPUs and the scaling,
handed to the planner (grids/planner.py); the answer the submit call, `ablate submit` and `ablate plan`
show, and what the grid stores (`Grid.plan`) for the launcher's re-planning and the dashboard.

An arm takes the GPU counts its batch divides into (1, 2, 4, ... up to the largest node) when the grid
says `gpus_per_arm: auto` and the arm names no `gpus`; otherwise the count it has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from pydantic import BaseModel

from model.spec import ArmSpec
from orchestrator.grids.gpu_share import splits
from orchestrator.grids.planner import PlanNode, PlanRun, Scaling, gpu_choices, plan_night
from orchestrator.grids.projection import GIVEN, MEASURED, Projection, Rates, project


class SlotPublic(BaseModel):
    run: str  # "A" with one seed, else "A#s" (seed s)
    arm: str
    seed: int
    gpus: int
    node: str
    start_h: float  # hours from submission (or from the re-plan)
    end_h: float


class PlanPublic(BaseModel):
    slots: list[SlotPublic]
    night_h: float
    lower_bound_h: float
    search: str  # exhaustive | greedy (grids/planner.py)
    hours: dict[str, float | None]  # each arm's single-GPU hours of training per run
    # each arm's hours per run that no GPU count shortens (start, compile, evaluations); 0 for given hours
    fixed_h: dict[str, float] = {}
    # each arm's part of fixed_h spent on distribution passes (eval.distribution), and whether it was measured
    # (earlier passes' distribution_seconds) or estimated (FLOPs: grids/distribution_price.py)
    distribution_h: dict[str, float] = {}
    distribution_sources: dict[str, str] = {}
    sources: dict[str, str]  # each arm's: measured | estimated | given
    scaling: dict[int, float]  # GPUs -> speedup used where measured or given; others 0.98 per doubling
    scaling_source: str  # measured | given | default
    gpu_model: str | None  # whose measured rates were used
    auto: bool  # the grid's GPU counts are the plan's (gpus_per_arm: auto): the launcher re-plans them
    moldable: list[str] = []  # the arms whose GPU count the plan chooses (auto, and no `gpus` named)
    unplanned: list[str]  # command arms (not projected) and runs no node can hold
    # When the launcher last redrew it (runs/replan.py); start_h and end_h count from then. None: as submitted.
    drawn_at: datetime | None = None

    def last_line(self) -> str:
        return f"night {self.night_h:.2f} h; lower bound {self.lower_bound_h:.2f} h"


def run_name(arm: str, seed: int, seeds: int) -> str:
    return arm if seeds == 1 else f"{arm}#{seed}"


def moldable(spec: ArmSpec) -> bool:
    """A built-in arm that names no `gpus`: `gpus_per_arm: auto` may choose its count."""
    return spec.command is None and "gpus" not in spec.model_fields_set


def arm_choices(spec: ArmSpec, largest: int, auto: bool) -> tuple[int, ...]:
    if not (auto and moldable(spec)):
        return (spec.gpu_count(),)
    return tuple(g for g in gpu_choices(largest) if splits(spec, g))


def planned_spec(spec: ArmSpec, plan: PlanPublic | None, arm: str, seed: int, seeds: int) -> ArmSpec:
    """The arm's spec at the GPU count the plan gives this run, where the plan chooses it (auto)."""
    if plan is None or not plan.auto or not moldable(spec):
        return spec
    slot = next((s for s in plan.slots if s.run == run_name(arm, seed, seeds)), None)
    if slot is None or slot.gpus == spec.gpus:
        return spec
    return spec.model_copy(update={"gpus": slot.gpus})


def plan_grid(
    resolved: Sequence[tuple[str, ArmSpec]],
    seeds: int,
    nodes: Mapping[str, int],
    rates: Rates,
    auto: bool,
    hours: Mapping[str, float] | None = None,
    scaling: Scaling | None = None,
) -> PlanPublic | None:
    """The plan for a grid about to be queued; None when no node's GPUs are known."""
    if not any(nodes.values()):
        return None
    projections = {
        # a given figure is a whole run: no fixed part on top of it
        label: Projection(hours[label], GIVEN) if hours and label in hours else project(spec, rates)
        for label, spec in resolved
    }
    measured_scaling = rates.scaling()
    used = dict(scaling) if scaling else measured_scaling
    largest = max(nodes.values())
    runs, unplanned = [], []
    for seed in range(seeds):
        for label, spec in resolved:
            name, h = run_name(label, seed, seeds), projections[label].hours
            if h is None:
                unplanned.append(name)
                continue
            runs.append(PlanRun(name, h, arm_choices(spec, largest, auto), projections[label].fixed_hours))
    plan = plan_night(runs, [PlanNode(n, g) for n, g in nodes.items()], used)
    passes = {label: p for label, p in projections.items() if p.distribution_hours}  # arms with eval.distribution
    owner = {run_name(label, seed, seeds): (label, seed) for seed in range(seeds) for label, _ in resolved}
    return PlanPublic(
        slots=[SlotPublic(run=s.run, arm=owner[s.run][0], seed=owner[s.run][1], gpus=s.gpus, node=s.node,
                          start_h=round(s.start, 4), end_h=round(s.end, 4)) for s in plan.slots],
        night_h=round(plan.night, 4),
        lower_bound_h=round(plan.lower_bound, 4),
        search=plan.search,
        hours={label: p.hours for label, p in projections.items()},
        fixed_h={label: round(p.fixed_hours, 4) for label, p in projections.items()},
        distribution_h={label: round(p.distribution_hours, 4) for label, p in passes.items()},
        distribution_sources={label: p.distribution_source for label, p in passes.items()},
        sources={label: p.source for label, p in projections.items()},
        scaling=used,
        scaling_source="given" if scaling else MEASURED if measured_scaling else "default",
        gpu_model=rates.gpu_model,
        auto=auto,
        moldable=[label for label, spec in resolved if auto and moldable(spec)],
        unplanned=[*unplanned, *plan.unplaced],
    )
