"""The night planner: each run's GPU count and start order, chosen so that the whole night (the makespan:
when the last run ends) is as short as it can be made. Pure and torch-free: grid submission, `ablate plan`
and the launcher's re-planning (orchestrator/runs/replan.py) all call `plan_night`.

A run of h single-GPU hours on g GPUs of one node takes f + h / speedup(g) hours (data-parallel, same
global batch), where f is what it pays whatever its GPUs: starting, compiling, evaluating at each checkpoint
(grids/projection.py). f is a few percent of a 5000-step run, but most of a 160-step one, where it makes one
GPU each beat a wide allotment. Choosing each job's GPU count to shorten the whole is moldable-task
scheduling (Turek, Wolf, Yu, "Approximate algorithms for scheduling parallelizable tasks", SPAA 1992):
an allotment (each run's g) and then list scheduling of the runs, longest first, each where it can start
earliest.

- Allotment search. Runs with the same hours and choices are interchangeable, so a class of k such runs
  counts how many take each GPU count (a multiset), not k-tuples. When the classes' multisets number at
  most EXHAUSTIVE_LIMIT, every allotment is tried. Past it, a greedy improvement starts from one GPU each
  and takes each move of one run of one class to the next GPU count up or down that shortens the night: a local
  optimum, and the plan says `search="greedy"` (`"greedy (capped)"` where GREEDY_PLACEMENTS cut it short).
- List scheduling. Each node is a list of the times its GPUs free (0: now; a running run's projected end).
  A run of g GPUs goes to the node where its end is earliest, on that node's g earliest-free GPUs. Two
  orders are tried (longest first; most GPUs first, then longest) and the shorter night kept.
- Lower bound. No plan beats the GPU-hours of the runs, each at its cheapest GPU count (one GPU, unless a
  measured speedup is above linear, as 2.04x on 2 GPUs is), plus the busy GPUs' remaining hours, spread over
  all GPUs; nor the longest run at its fastest GPU count; nor the last busy GPU.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

DEFAULT_EFFICIENCY = 0.98  # data-parallel efficiency per doubling of GPUs until a GPU model's is measured
EXHAUSTIVE_LIMIT = 4000  # allotments tried one by one; past it the greedy improvement (a few ms per try)
# The greedy improvement's work cap, in runs placed (a try of n runs places n): about a second of Python,
# so a grid of 64 arms x 16 seeds is answered at submission; a plan cut short says "greedy (capped)".
GREEDY_PLACEMENTS = 300_000
Scaling = Mapping[int, float]  # GPUs -> speedup over one GPU, as measured (1 -> 1.0 implied)


def speedup(gpus: int, measured: Scaling | None = None) -> float:
    """How many times faster a run is on `gpus` GPUs than on one: measured where known, else
    DEFAULT_EFFICIENCY per doubling (2 GPUs: 1.96x, 4: 3.84x)."""
    if gpus <= 1:
        return 1.0
    if measured and gpus in measured:
        return measured[gpus]
    return gpus * DEFAULT_EFFICIENCY ** math.log2(gpus)


def gpu_choices(largest_node: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to the largest node's GPUs."""
    return tuple(2**i for i in range(int(math.log2(max(largest_node, 1))) + 1))


@dataclass(frozen=True)
class PlanRun:
    """One run to plan: `hours` of training on one GPU; `choices`, the GPU counts it may take (one: fixed);
    `fixed`, the hours it takes whatever its GPUs (start, compile, evaluations), held on each of them."""

    name: str
    hours: float
    choices: tuple[int, ...] = (1,)
    fixed: float = 0.0

    def duration(self, gpus: int, scaling: Scaling | None = None) -> float:
        return self.fixed + self.hours / speedup(gpus, scaling)


@dataclass(frozen=True)
class PlanNode:
    """A node's GPUs; `busy`, the hours from now until each of its held GPUs frees (a running run's)."""

    name: str
    gpus: int
    busy: tuple[float, ...] = ()


@dataclass(frozen=True)
class Slot:
    run: str
    gpus: int
    node: str
    start: float  # hours from now
    end: float


@dataclass(frozen=True)
class Plan:
    slots: tuple[Slot, ...]  # in start order
    night: float  # hours from now until the last planned run ends (or the last busy GPU frees)
    lower_bound: float
    search: str  # "exhaustive" | "greedy" | "greedy (capped)"
    unplaced: tuple[str, ...] = field(default=())  # runs no node is large enough for

    def slot(self, run: str) -> Slot | None:
        return next((s for s in self.slots if s.run == run), None)


Scored = tuple[tuple[float, float], list[Slot], float]  # (night, sum of ends), the slots, the night


def _schedule(
    runs: Sequence[PlanRun], gpus: Sequence[int], nodes: Sequence[PlanNode], scaling: Scaling | None,
) -> tuple[list[Slot], float]:
    """List scheduling of one allotment: the best of two orders; the slots and the night."""
    best: tuple[list[Slot], float] | None = None
    durations = [r.duration(g, scaling) for r, g in zip(runs, gpus, strict=True)]
    orders = (
        sorted(range(len(runs)), key=lambda i: (-durations[i], -gpus[i], i)),
        sorted(range(len(runs)), key=lambda i: (-gpus[i], -durations[i], i)),
    )
    base = {n.name: sorted([*n.busy, *[0.0] * (n.gpus - len(n.busy))]) for n in nodes}
    floor = max((t for n in nodes for t in n.busy), default=0.0)
    for order in orders if len(set(gpus)) > 1 else orders[:1]:
        free = {name: list(times) for name, times in base.items()}
        slots = []
        for i in order:
            g = gpus[i]
            fits = [(free[n][g - 1] + durations[i], free[n][g - 1], n) for n in free if len(free[n]) >= g]
            end, start, node = min(fits)
            free[node] = sorted([end] * g + free[node][g:])
            slots.append(Slot(runs[i].name, g, node, start, end))
        night = max([floor, *(s.end for s in slots)])
        if best is None or night < best[1] - 1e-12:
            best = (slots, night)
    assert best is not None
    return best


def _score(slots: list[Slot], night: float) -> tuple[float, float]:
    """The night first; then the sum of ends, so a greedy step that frees GPUs sooner counts."""
    return round(night, 9), sum(s.end for s in slots)


def _class_allotments(size: int, choices: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The multisets of `size` GPU counts drawn from `choices`, each as a sorted tuple."""
    return list(itertools.combinations_with_replacement(choices, size))


def plan_night(runs: Iterable[PlanRun], nodes: Sequence[PlanNode], scaling: Scaling | None = None) -> Plan:
    """The plan that makes the night shortest among those searched (see the module's docstring)."""
    nodes = [n for n in nodes if n.gpus > 0]
    largest = max((n.gpus for n in nodes), default=0)
    placeable, unplaced = [], []
    for run in runs:
        choices = tuple(sorted({g for g in run.choices if g <= largest}))
        if choices:
            placeable.append(dataclasses.replace(run, choices=choices))
        else:
            unplaced.append(run.name)
    busy_hours = sum(t for n in nodes for t in n.busy)
    total_gpus = sum(n.gpus for n in nodes)
    if not placeable:
        night = max((t for n in nodes for t in n.busy), default=0.0)
        return Plan((), night, night, "exhaustive", tuple(unplaced))
    classes: dict[tuple[float, float, tuple[int, ...]], list[PlanRun]] = {}
    for run in placeable:
        classes.setdefault((run.hours, run.fixed, run.choices), []).append(run)
    members = [run for group in classes.values() for run in group]
    per_class = [_class_allotments(len(group), key[2]) for key, group in classes.items()]

    def evaluate(picks: Sequence[tuple[int, ...]]) -> Scored:
        gpus = [g for pick in picks for g in pick]
        slots, night = _schedule(members, gpus, nodes, scaling)
        return _score(slots, night), slots, night

    if math.prod(len(options) for options in per_class) <= EXHAUSTIVE_LIMIT:
        search = "exhaustive"
        score, slots, night = min((evaluate(picks) for picks in itertools.product(*per_class)), key=lambda e: e[0])
    else:
        (score, slots, night), capped = _greedy(per_class, evaluate, GREEDY_PLACEMENTS // len(members))
        search = "greedy (capped)" if capped else "greedy"
    bound = max(
        (busy_hours + sum(min(g * r.duration(g, scaling) for g in r.choices) for r in placeable)) / total_gpus,
        max(min(r.duration(g, scaling) for g in r.choices) for r in placeable),
        max((t for n in nodes for t in n.busy), default=0.0),
    )
    ordered = tuple(sorted(slots, key=lambda s: (s.start, -s.gpus, s.run)))
    return Plan(ordered, night, bound, search, tuple(unplaced))


def _greedy(
    per_class: list[list[tuple[int, ...]]], evaluate: Callable[[Sequence[tuple[int, ...]]], Scored], tries: int
) -> tuple[Scored, bool]:
    """From one GPU each (each class's first multiset), move to a better neighbour (one run of one class
    one GPU count up or down) while one shortens the night, for at most `tries` evaluations; the best
    found and whether the cap cut it short."""
    index = [0] * len(per_class)
    current = evaluate([options[0] for options in per_class])
    tries -= 1
    improved = True
    while improved:  # first improvement: a move is taken as soon as it shortens the night
        improved = False
        for c, options in enumerate(per_class):
            for j in _neighbours(options, index[c]):
                if tries <= 0:
                    return current, True
                tries -= 1
                trial = [options[k] for options, k in zip(per_class, index, strict=True)]
                trial[c] = options[j]
                found = evaluate(trial)
                if found[0] < current[0]:
                    current, index[c], improved = found, j, True
                    break
    return current, False


def _neighbours(options: list[tuple[int, ...]], at: int) -> list[int]:
    """The multisets that differ from options[at] by one run moved to an adjacent GPU count."""
    here = options[at]
    return [j for j, other in enumerate(options) if j != at and _one_move(here, other)]


def _one_move(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    diff_a = list(a)
    for g in b:
        if g in diff_a:
            diff_a.remove(g)
    diff_b = list(b)
    for g in a:
        if g in diff_b:
            diff_b.remove(g)
    return len(diff_a) == 1 and len(diff_b) == 1 and max(diff_a[0], diff_b[0]) == 2 * min(diff_a[0], diff_b[0])
