"""A simulated deciding grid taken look by look through the product's own rule: orchestrator/results/deciding/
plan_look.py `plan_look`, the function results/deciding/decider.py `take_look` calls. Each look reads every
comparison's seeds x images table of differences (a `read` function of the caller: the report's crossed
interval, unpaired where the arms' seeds share no effect, or as a grid that borrows reads it; it also gets
every arm's runs' values by seed), hands plan_look the arms' seeds, the images evaluated and
what a seed and an image cost, and does the work it returns: an evaluation of every run on more images, or
each arm's seeds raised to their planned count. bench/decide_sim.py and bench/decide_vs_adastop.py run
their studies through `grid_study`, so what they measure is what a grid does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from model.flow_headline import HEADLINE
from orchestrator.grids.deciding import DecideSpec
from orchestrator.results.deciding.decisions import ComparisonLook
from orchestrator.results.deciding.expected import againsts
from orchestrator.results.deciding.plan_look import LookState, Reading, plan_look
from orchestrator.results.deciding.sequential import Costs, Variance
from orchestrator.results.reports import crossed
from orchestrator.results.reports.crossed import Components, CrossedInterval
from orchestrator.results.reports.stats import t_quantile

Pair = tuple[str, str]
Runs = Mapping[str, Mapping[int, float]]  # each arm's runs' values by seed, on the look's images


def table_components(diff: np.ndarray) -> Components:
    """The report's components of a k x n table of differences (crossed.py `components`), its mean squares
    summed by numpy: crossed.py sums them in Python, 7 ms a table of 8 x 256, most of a study's time. The
    reading of the mean squares (clipping, df, the priced seed) is crossed.py's own (tests: equal to it)."""
    k, n = diff.shape
    grand, rows, cols = float(diff.mean()), diff.mean(axis=1), diff.mean(axis=0)
    ms_seed = n * float(((rows - grand) ** 2).sum()) / (k - 1)
    ms_rest = float(((diff - rows[:, None] - cols[None, :] + grand) ** 2).sum()) / ((k - 1) * (n - 1))
    ms_image = k * float(((cols - grand) ** 2).sum()) / (n - 1)
    side = crossed._Side(k, ms_seed, ms_rest, cols.tolist(), grand)
    return crossed._read([side], ms_image / k, n)


def table_interval(diff: np.ndarray) -> CrossedInterval:
    """The report's crossed interval of a k x n table of differences (crossed.py `crossed_interval`)."""
    return crossed._interval(float(diff.mean()), table_components(diff), t_quantile)


@dataclass(frozen=True)
class TableReading:
    """What a caller's `read` gives for one comparison's k x n differences: its mean, SE, df and the variance
    components that project it; se None where there is no interval (one seed, nothing borrowed)."""

    mean: float
    se: float | None
    df: float | None
    variance: Variance | None


@dataclass(frozen=True)
class GridOutcome:
    looks: dict[Pair, ComparisonLook]  # each comparison's final decision (and the look it was taken at)
    seeds: dict[str, int]
    images: int
    hours: float
    waves: int


def grid_study(values: Mapping[str, np.ndarray], pairs: Sequence[Pair], spec: DecideSpec,
               read: Callable[[np.ndarray, Pair, Runs], TableReading], seed_hours: Mapping[str, float],
               image_hours: float, *, min_seeds: Mapping[str, int] | None = None,
               images: int = 64, max_images: int = 256) -> GridOutcome:  # fmt: skip
    """One grid over the study's `values` (each arm's seeds x images table) decided at `spec` (its alpha the
    comparison's), look by look through plan_look until no work is left. `min_seeds`: each arm's seeds to
    start (default spec.min_seeds), `images`: what every run was first scored on (the training records')."""
    arms = list(values)
    seeds = dict(min_seeds) if min_seeds is not None else dict.fromkeys(arms, spec.min_seeds)
    n_now, asked = images, None
    against = againsts(pairs)
    previous: dict[tuple[str, str, str], ComparisonLook] = {}
    looks: dict[Pair, ComparisonLook] = {}
    look = 0
    while True:
        look += 1
        readings = []
        # each arm's runs by seed, valued on the images now (what decider.py reads a grid's own runs at)
        runs = {a: dict(enumerate(values[a][: seeds[a], :n_now].mean(axis=1).tolist())) for a in arms}
        for p in pairs:
            k = min(seeds[p[0]], seeds[p[1]])
            key = (p[0], HEADLINE, against[p])
            closed = key in previous and previous[key].decision != "open"
            r = (TableReading(0.0, None, None, None) if closed
                 else read(values[p[0]][:k, :n_now] - values[p[1]][:k, :n_now], p, runs))  # fmt: skip
            readings.append(Reading(arm=p[0], against=key[2], other_arm=p[1], metric=HEADLINE, diff=r.mean,  # type: ignore[arg-type]
                                    low=None, high=None, k=k, n=n_now, se=r.se, df=r.df, variance=r.variance,
                                    costs=Costs(seed_hours[p[0]], seed_hours[p[1]], image_hours)))  # fmt: skip
        state = LookState(readings=readings, decide=spec, look=look, seeds=seeds, images_asked=asked,
                          max_images=max_images, readable=max_images, spent=0.0, seed_hours=seed_hours,
                          evaluation_start=0.0, evaluation_image=image_hours * sum(seeds.values()),
                          previous=previous)  # fmt: skip
        plan = plan_look(state)
        previous = {c.key(): c for c in plan.comparisons}
        looks = {(c.arm, c.other_arm): c for c in plan.comparisons}
        if plan.work.images is not None:
            n_now = asked = plan.work.images
        elif plan.work.seeds:
            seeds.update(plan.work.seeds)
        else:
            break
    hours = sum(seeds[a] * (seed_hours[a] + n_now * image_hours) for a in arms)
    return GridOutcome(looks, seeds, n_now, hours, look)
