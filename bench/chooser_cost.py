"""What does pricing actions from 2 or 3 seeds cost? A deciding grid's chooser (results/deciding/sequential.py
`choose_action`) buys, for an open comparison, whichever of one more seed of both arms or an evaluation on
4x the images removes most of its mean's variance per GPU-hour, with the variance components read from the
look's own seeds x images table (results/deciding/decider.py `components_of`, from the report's noise budget). With
2 or 3 seeds the seed component rests on a mean square with 1 or 2 df. This simulation charges the chooser's
choices in GPU-hours against the choices the same chooser makes with the true components.

Each study draws one comparison's whole table of paired differences (8 seeds x 256 images, the default
max_seeds and decide_sim's split; seed + image + rest, normal) and starts at 2 seeds x 64 images. At each
step the chooser reads the table so far (the report's crossed interval, its noise budget priced from the
runs' costs, components_of, action_costs) or is given the true components, and buys its action, until the
true variance of the mean reaches the target: the geometric middle between the start's and the budget's
("mid") or 1.3x the budget's ("near"). The action that crosses the target is charged pro rata (in log
variance): where a target falls is arbitrary, and a whole action bought past it would be charged to
whichever policy's path happens to end there (both are printed). Both policies read the same tables.
"clipped" is main 8413b5c's chooser: the budget's seed share as measured, zero where its mean square came
out below the rest's.

Profiles (difference-level SDs seed / image / rest): issue 56's mixed 0.002 / 0.011 / 0.004,
image-dominated 0.001 / 0.011 / 0.0018, seed-dominated 0.006 / 0.0015 / 0.006, and 3x (mixed with one arm's
seed SD 3x the other's: the difference's seed SD sqrt 5 x). Costs (GPU-hours): "H100" a seed run 3.2 h and
an image 10 s / 64 per run, a job's start 15 s (bench/decide_sim.py); "defaults" what the decider assumes
unmeasured (a run 1 h, an evaluation of 64 images 5% of it, a start 15 s); "short runs" a run 3 min, 256
images 3 min, a start 60 s (issue 50's 200-step runs, where an evaluation costs about as much as training).

    python bench/chooser_cost.py            # 2000 studies a cell, on every core
    python bench/chooser_cost.py --quick    # 300 a cell

The last line reads `chooser_cost <the largest ratio of the chooser's mean GPU-hours to the true
components' over the cells> (clipped <its largest>)`; the line before gives it per cost setting.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from orchestrator.results.deciding.decider import action_costs, components_of
from orchestrator.results.deciding.sequential import Costs, Variance, VarianceComponents, choose_action, mean_variance
from orchestrator.results.reports.costs import RunCost
from orchestrator.results.reports.crossed import crossed_interval
from orchestrator.results.reports.effects import noise_budget
from orchestrator.results.reports.model import Effect
from orchestrator.results.reports.stats import t_quantile

K0, N0, MAX_SEEDS, MAX_IMAGES = 2, 64, 8, 256
PROFILES = {"mixed": (0.002, 0.011, 0.004), "image-dominated": (0.001, 0.011, 0.0018),
            "seed-dominated": (0.006, 0.0015, 0.006), "3x": (0.002 * math.sqrt(5), 0.011, 0.004)}  # fmt: skip


@dataclass(frozen=True)
class Pricing:
    """A run's GPU-hours, one image on one run, an evaluation job's start."""

    run: float
    image: float
    start: float


PRICING = {"H100": Pricing(3.2, 10 / 64 / 3600, 15 / 3600), "defaults": Pricing(1.0, 0.05 / 64, 15 / 3600),
           "short runs": Pricing(0.05, 0.05 / 256, 60 / 3600)}  # fmt: skip
TARGETS = ("mid", "near")
POLICIES = ("true", "chooser", "clipped")


def effect_of(table: np.ndarray, p: Pricing) -> Effect:
    """The look's effect as the report gives it: crossed interval and noise budget priced from the runs."""
    crossed = crossed_interval(table.tolist(), t_quantile)
    assert crossed is not None
    c = crossed.components
    run = RunCost(hours=p.run, eval_minutes=p.image * 60 * c.n, n=c.n, on_gpu=True)
    return Effect(arm="B", metric="val_flow_ivw", against="control", other_arm="A", step=1, diff=crossed.mean,
                  low=crossed.low, high=crossed.high, k=c.k, seed_sd=None, eval_se=None, noise="", interval="crossed",
                  se=crossed.se, df=c.df, n=c.n, budget=noise_budget(c, c.df, [run] * 2 * c.k), reading="within noise",
                  per_seed=[])  # fmt: skip


def clipped(e: Effect) -> Variance:
    """main 8413b5c's components_of: the budget's shares as measured."""
    assert e.budget is not None and e.se is not None
    var, b = e.se**2, e.budget
    return Variance(seed=b.seeds * var * e.k, image=b.images * var * (e.n or 1), rest=b.rest * var * e.k * (e.n or 1))


def spend(table: np.ndarray, truth: Variance, p: Pricing, target: float, policy: str) -> tuple[float, float]:
    """(GPU-hours to the target, the crossing action pro rata; the same with it whole) for one study."""
    k, n = K0, N0
    jobs = [(p.start * 3600 + N0 * p.image * 3600, N0)]  # the first evaluation job, as evaluation_jobs reads it
    hours = whole = 0.0
    while mean_variance(truth, k, n) > target * (1 + 1e-12):
        e = effect_of(table[:k, :n], p)
        costs: Costs = action_costs(e, jobs)
        v: VarianceComponents = truth if policy == "true" else components_of(e) if policy == "chooser" else clipped(e)
        act = choose_action(v, k, n, costs, max_seeds=MAX_SEEDS, max_images=MAX_IMAGES)
        if act.kind == "none":
            break
        before, after = mean_variance(truth, k, n), mean_variance(truth, act.k, act.n)
        part = 1.0 if after > target else math.log(before / target) / math.log(before / after)
        hours, whole = hours + part * act.gpu_hours, whole + act.gpu_hours
        k, n = act.k, act.n
    return hours, whole


def cell(profile: str, pricing: str, target_name: str, studies: int, index: int) -> dict[str, tuple[float, float]]:
    """Mean (pro rata, whole) GPU-hours of each policy over `studies` tables drawn from the cell's own seed."""
    s, i, r = PROFILES[profile]
    truth, p = Variance(s * s, i * i, r * r), PRICING[pricing]
    start, end = mean_variance(truth, K0, N0), mean_variance(truth, MAX_SEEDS, MAX_IMAGES)
    target = math.sqrt(start * end) if target_name == "mid" else 1.3 * end
    rng = np.random.default_rng([56, index])
    sums = {policy: [0.0, 0.0] for policy in POLICIES}
    for _ in range(studies):
        table = (rng.normal(0, s, (MAX_SEEDS, 1)) + rng.normal(0, i, (1, MAX_IMAGES))
                 + rng.normal(0, r, (MAX_SEEDS, MAX_IMAGES)))  # fmt: skip
        for policy in POLICIES:
            pro, whole = spend(table, truth, p, target, policy)
            sums[policy][0] += pro / studies
            sums[policy][1] += whole / studies
    return {policy: (a, b) for policy, (a, b) in sums.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="300 studies a cell instead of 2000")
    ap.add_argument("--studies", type=int, help="studies a cell (overrides --quick)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes (default: every core)")
    args = ap.parse_args()
    studies = args.studies or (300 if args.quick else 2000)
    cells = [(pr, pc, t) for pr in PROFILES for pc in PRICING for t in TARGETS]
    start = time.monotonic()
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(cell, *zip(*cells, strict=True), [studies] * len(cells), range(len(cells))))
    print(f"{studies} studies a cell; start {K0} seeds x {N0} images, budget {MAX_SEEDS} x {MAX_IMAGES}")
    print("| profile | costs | target | true components: GPU-h | chooser / true | clipped / true "
          "| the same, the crossing action whole: chooser / true | clipped / true |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    worst: dict[str, tuple[float, float]] = {}
    for (profile, pricing, target), got in zip(cells, results, strict=True):
        true = got["true"]
        ratio = [got[p][j] / true[j] for p in ("chooser", "clipped") for j in (0, 1)]
        print(f"| {profile} | {pricing} | {target} | {true[0]:.3g} | {ratio[0]:.3f} | {ratio[2]:.3f} | {ratio[1]:.3f} "
              f"| {ratio[3]:.3f} |", flush=True)  # fmt: skip
        w = worst.get(pricing, (0.0, 0.0))
        worst[pricing] = (max(w[0], ratio[0]), max(w[1], ratio[2]))
    print(f"({time.monotonic() - start:.0f} s)")
    print("; ".join(f"{pricing}: chooser {c:.3f} (clipped {k:.3f})" for pricing, (c, k) in worst.items()))
    print(f"chooser_cost {max(c for c, _ in worst.values()):.3f} (clipped {max(k for _, k in worst.values()):.3f})")


if __name__ == "__main__":
    main()
