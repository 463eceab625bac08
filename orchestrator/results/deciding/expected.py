"""The GPU-hours a deciding grid is expected to cost, for the submit answer (submit_cost.py `decide_cost`):
simulated grids taken look by look through the product's own rule, plan_look.py `plan_look` (the function
results/deciding/decider.py `take_look` calls), so the expected grid runs what a grid runs: its comparisons
evaluated on the split's images first where that is cheap beside a seed, seeds only at the planned counts
(plan_look.py `next_seed_count`: 2, 3, 4, 5, 6, 8), the levels of few df read on each look's seeds, and the
budget's caps (max_gpu_hours, max_looks, max_evaluations) refusing work as they refuse a grid's.

Each look reads every open comparison as a grid would with its variance known: the mean drawn on the
information scale with the given components and true effect (independent increments from look to look), its
SE the components' (sequential.py `mean_variance`), its df `decision_df`. The variance's own draw is left
out, so this approximates what bench/decide_sim.py measures with the variance estimated as a grid does
(bench/decide_looks.py `grid_study`: plan_look on simulated tables). Comparisons draw independently (arms
are shared for cost only), on the grid's first decided metric. Measured at A-D's hours (6.66, 3.15, 3.16,
3.23 GPU-h a run, 5 comparisons, 64 then 256 images, evaluations free) at the default spec: about 55.8
GPU-hours here, against 52.9 +- 1.3 through grid_study on tables drawn with the same components read at
their known variance, and 49.6 +- 1.1 with the variance estimated from the tables: the known variance
errs high, by about a tenth.

Evaluations are priced as a grid runs them: an images action evaluates every run of the grid, a seed added
after one is caught up on its images, and each evaluation's runs are scored by one worker with one start per
BATCH_RUNS runs (runs/evaluation_batch.py: the jobs of an evaluation on one node share a worker), none for
an evaluation on the split's images where the runs were scored on them inside their training jobs
(runs/in_training.py: runs on one GPU, `in_training`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from orchestrator.grids.deciding import DecideSpec
from orchestrator.results.deciding.decisions import ComparisonLook
from orchestrator.results.deciding.plan_look import LookState, Reading, plan_look
from orchestrator.results.deciding.sequential import MEASURED, Costs, VarianceComponents, decision_df, mean_variance
from orchestrator.runs.evaluation_batch import BATCH_RUNS

Pair = tuple[str, str]
Outcome = tuple[float, dict[str, int], list[list[ComparisonLook]]]  # GPU-hours, each arm's seeds, each look's


def againsts(pairs: Sequence[Pair]) -> dict[Pair, str]:
    """Each comparison's `against` in a look's key: an arm's first comparison is against its parent, its
    second against the control (grids/deciding.py submitted_pairs lists the parent first). The simulations'
    grids key their looks the same way (bench/decide_looks.py)."""
    seen: set[str] = set()
    out = {}
    for arm, other in pairs:
        out[arm, other] = "control" if arm in seen else "parent"
        seen.add(arm)
    return out


def simulated_grid(decide: DecideSpec, seed_hours: Mapping[str, float], comparisons: Sequence[Pair],
                   rng: np.random.Generator, *, images: int, max_images: int,
                   image_hours: Mapping[str, float] | None = None, start: float = 0.0,
                   variance: VarianceComponents = MEASURED, effect: float = 0.0,
                   batch_runs: int = BATCH_RUNS, in_training: bool = False) -> Outcome:  # fmt: skip
    """One simulated grid at `decide` (its alpha the comparison's, its caps filled in: grids/deciding.py
    with_budget), every arm of a comparison starting at decide.min_seeds, each run scored on `images` by its
    training records. `image_hours`: one image of one run's evaluation, each arm's, without the start
    (None: free); `start`: one evaluation worker's start; `in_training`: runs scored on the split's images
    (max_images) inside their training jobs (runs/in_training.py), those evaluations with no start. Returns
    (its GPU-hours, each arm's seeds at the end, each look's comparisons as plan_look returned them)."""
    pairs = list(comparisons)
    arms = list(dict.fromkeys(a for pair in pairs for a in pair))
    per_image = {a: (image_hours or {}).get(a, 0.0) for a in arms}
    metric = next(iter(decide.margin))
    against = againsts(pairs)
    borrowed = bool(decide.borrow_from)
    seeds = dict.fromkeys(arms, decide.min_seeds)
    n_now, asked = images, None
    state = {p: (0.0, 0.0) for p in pairs}  # (sum of increments on the information scale, information)
    previous: dict[tuple[str, str, str], ComparisonLook] = {}
    runs = sum(seeds[a] * seed_hours[a] for a in arms)
    evaluated, evaluations, looks = 0.0, 0, []

    def evaluate(counts: Mapping[str, int], n: int) -> float:  # one evaluation of `counts` runs of each arm
        starts = 0 if in_training and n == max_images else math.ceil(sum(counts.values()) / batch_runs)
        return starts * start + sum(c * n * per_image[a] for a, c in counts.items())

    while True:
        readings = []
        for p in pairs:
            k = min(seeds[p[0]], seeds[p[1]])
            info = 1 / mean_variance(variance, k, n_now)
            score, had = state[p]
            closed = (p[0], metric, against[p]) in previous and previous[p[0], metric, against[p]].decision != "open"
            if info > had and not closed:
                score += rng.normal(effect * (info - had), math.sqrt(info - had))
                state[p] = (score, info)
            read = k >= 2 or borrowed  # one seed is read only with a borrowed seed variance
            df = decision_df(variance, k, n_now) if k >= 2 and n_now >= 2 else None
            readings.append(Reading(arm=p[0], against=against[p], other_arm=p[1], metric=metric,  # type: ignore[arg-type]
                                    diff=score / state[p][1] if state[p][1] > 0 else 0.0, low=None, high=None, k=k,
                                    n=n_now, se=1 / math.sqrt(info) if read else None, df=df,
                                    variance=variance if read else None,  # type: ignore[arg-type]
                                    costs=Costs(seed_hours[p[0]], seed_hours[p[1]],
                                                (per_image[p[0]] + per_image[p[1]]) / 2, start)))  # fmt: skip
        s = LookState(readings=readings, decide=decide, look=len(looks) + 1, seeds=seeds, images_asked=asked,
                      max_images=max_images, readable=max_images, spent=runs + evaluated, seed_hours=seed_hours,
                      evaluation_start=start, evaluation_image=evaluate(seeds, 1) - start, evaluations=evaluations,
                      previous=previous, last_look=len(looks) + 1 >= (decide.max_looks or math.inf))  # fmt: skip
        plan = plan_look(s)
        looks.append(plan.comparisons)
        previous = {c.key(): c for c in plan.comparisons}
        if plan.work.images is not None:  # every run of the grid evaluated on the images asked
            n_now = asked = plan.work.images
            evaluated += evaluate(seeds, n_now)
            evaluations += 1
        elif plan.work.seeds:
            new = {a: k - seeds[a] for a, k in plan.work.seeds.items() if k > seeds[a]}
            runs += sum(c * seed_hours[a] for a, c in new.items())
            seeds.update(plan.work.seeds)
            if asked is not None:  # the new runs caught up on the largest evaluation's images
                evaluated += evaluate(new, asked)
                evaluations += 1
        else:
            return runs + evaluated, seeds, looks


def expected_gpu_hours(decide: DecideSpec, seed_hours: Mapping[str, float], comparisons: Sequence[Pair], *,
                       images: int, max_images: int, evaluation: Callable[[str, int], float] | None = None,
                       start: float = 0.0, in_training: bool = False,
                       variance: VarianceComponents = MEASURED, effect: float = 0.0,
                       studies: int = 200, seed: int = 0) -> float:  # fmt: skip
    """The mean GPU-hours over `studies` simulated grids (simulated_grid), with `variance` (the measured
    headline's by default) and true `effect` (0: no arm differs, the longest case). `evaluation(arm, n)`: one
    run's evaluation pass on n images, without the start (None: free)."""
    rng = np.random.default_rng(seed)
    arms = {a for pair in comparisons for a in pair}
    image_hours = {a: evaluation(a, max_images) / max_images for a in arms} if evaluation is not None else None
    total = 0.0
    for _ in range(studies):
        total += simulated_grid(decide, seed_hours, comparisons, rng, images=images, max_images=max_images,
                                image_hours=image_hours, start=start, variance=variance, effect=effect,
                                in_training=in_training)[0]  # fmt: skip
    return total / studies
