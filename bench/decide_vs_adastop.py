"""Our deciding grid in its familywise mode against AdaStop, the published group-sequential test over seeds
with a familywise guarantee (Mathieu et al. 2023, "AdaStop: adaptive statistical testing for sound
comparisons of Deep RL agents"; `adastop` 0.1.3, its `MultipleAgentsComparator`), reading the same
simulated studies: arms A-D, the lineage comparisons B-A, C-B, C-A, D-C, D-A, values drawn by
bench/decide_sim.py `draw` (each arm's value on seed s and image i is mean + seed_s + image_i + rest_si with
the measured components of a difference; B-A and D-C null, the other three differ by the effect).

Ours: the decision pass of a grid with the product's default `DecideSpec` (2 seeds to start, up to 8, the
whole 256-image split, futility at its default) at alpha 0.05 familywise: each of the five comparisons
spends `comparison_alpha(0.05, 5, "familywise")` (Bonferroni), read by the report's crossed interval
(bench/decide_sim.py `read`), decided by orchestrator/results/deciding/sequential.py `decide`, its next action by
`choose_action` and `plan_wave`: more images or one more seed of both arms, whichever buys most.

AdaStop: each run is one score, its mean over 64 images; each interim adds `--adastop-n` runs of every
arm still in an undecided comparison, up to `--adastop-k` interims, and decides by its permutation test at
alpha 0.05 familywise (two-sided, step-down over the comparisons still open); what is open at the last
interim is "equal". adastop 0.1.3 reads the two-sided statistic |T| against the permutation quantile of the
signed one, so it rejects at twice the alpha it is given (one null comparison: 9.7% to 10.1% at 0.05;
`--level-check`); it is handed alpha/2, so that it holds its stated level. Two ways to score a run: on its
own 64 images (fresh for each run, as an RL agent is evaluated on fresh episodes: AdaStop's use) and on the
same 64 for every run (a fixed held-out set, as a grid's evaluation is).

What each method's decision covers differs. Ours reads the seeds x images table crossed: its interval
covers the training seeds and the evaluation images, so its decision is about the arms on the population
of images the split is drawn from. AdaStop's permutation test sees runs only. Scored on their own images,
the image noise is inside each run's score and its guarantee covers seeds and images together (at the
price of that noise in every run, where the crossed reading takes it out once per image). Scored on the
same 64, what those images happen to favour in one arm over another (the arm-by-image component, image SD
0.011 on the headline) is one fixed offset to it, not noise: its guarantee then holds for the arms on those
64 images only. Each study's familywise error is counted against the truth a report is read as, the
population difference: any null comparison called, or any other called the wrong way. In the "images
alike" cell the arm-by-image SD is 0, where the two nulls coincide.

Costs as in bench/decide_sim.py: a seed of A 6.66, B 3.15, C 3.16, D 3.23 GPU-h, an image 10 s / 64 on one
run. Power: the share of studies in which C-B, C-A and D-A are each called better.

    PYTHONPATH=$PWD python bench/decide_vs_adastop.py --quick   # 200 studies a cell, 5 cells, 1 core: minutes
    PYTHONPATH=$PWD python bench/decide_vs_adastop.py --workers 2   # 1,000 a cell, 7 cells: docs/benchmarks.md

The last line reads `ours_gpu_hours X adastop_gpu_hours Y fwer_ours A fwer_adastop B power_ours P
power_adastop Q fwer_adastop_shared_images C`: GPU-hours per study and power (mean over C-B, C-A, D-A)
averaged over the headline cells (the measured components), the familywise errors the largest over them;
AdaStop's with each run scored on its own images (the way its guarantee covers the images), and last its
familywise error when every run is scored on the same 64.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from importlib.metadata import version

import numpy as np

from bench.decide_looks import grid_study
from bench.decide_sim import (
    ALPHA,
    ARMS,
    COMPARISONS,
    IMAGE_HOURS,
    NULL,
    PROFILES,
    SEED_HOURS,
    Cell,
    Design,
    decide_spec,
    draw,
    reader,
)
from orchestrator.grids.deciding import DecideSpec
from orchestrator.results.deciding.sequential import (
    FUTILITY,
    comparison_alpha,
)

SPLIT = 256  # held-out images: the default DecideSpec's max_images (None) is the whole split
ADASTOP_IMAGES = 64  # what every run is scored on, as the fixed design and our first wave
METHODS = {"adastop own images": True, "adastop shared images": False}  # AdaStop's two ways to score a run
BETTER = ("C-B", "C-A", "D-A")  # C and D are lower (better) than A and B by the effect
# Beside decide_sim's profiles: the seed-dominated one, and one where every arm responds to the
# images alike (no arm-by-image component), where AdaStop's null is the population null.
EXTRA_PROFILES = {"seed-dominated": (0.006, 0.0015, 0.006), "images alike": (0.006, 0.0, 0.006)}
PROFILES.update(EXTRA_PROFILES)  # decide_sim's draw reads its own table of profiles


@dataclass
class Outcome:
    """One method on one study: each comparison's call ("better", "worse" or "none") and the GPU-hours."""

    calls: dict[str, str]
    hours: float


@dataclass
class Tally:
    studies: int = 0
    wrong: dict[str, int] = field(default_factory=dict)  # method -> studies with any wrong call
    called: dict[tuple[str, str], int] = field(default_factory=dict)  # (method, comparison) -> called better
    hours: dict[str, float] = field(default_factory=dict)
    runs: dict[str, float] = field(default_factory=dict)  # arm-seeds trained

    def add(self, method: str, out: Outcome, runs: int) -> None:
        self.wrong[method] = self.wrong.get(method, 0) + familywise_error(out.calls)
        for key in BETTER:
            self.called[method, key] = self.called.get((method, key), 0) + (out.calls[key] == "better")
        self.hours[method] = self.hours.get(method, 0.0) + out.hours
        self.runs[method] = self.runs.get(method, 0) + runs


def merged(a: Tally, b: Tally) -> Tally:
    def plus(x: dict, y: dict) -> dict:
        return {key: x.get(key, 0) + y.get(key, 0) for key in {*x, *y}}

    return Tally(a.studies + b.studies, plus(a.wrong, b.wrong), plus(a.called, b.called), plus(a.hours, b.hours),
                 plus(a.runs, b.runs))  # fmt: skip


def key(pair: tuple[str, str]) -> str:
    return "-".join(pair)


def familywise_error(calls: dict[str, str]) -> bool:
    """Any null comparison called, or any other called the wrong way (worse where it is better)."""
    return any(calls[key(p)] != "none" for p in NULL) or any(calls[k] == "worse" for k in BETTER)


def ours(values: dict[str, np.ndarray], spec: DecideSpec) -> tuple[Outcome, int]:
    """The decision pass over one study at the spec, each comparison at its familywise share of alpha:
    the product's plan_look over the study (bench/decide_looks.py), every comparison's call kept."""
    design = Design(min_seeds=spec.min_seeds, max_seeds=spec.max_seeds, max_images=SPLIT,
                    futility=FUTILITY if spec.futility is None else spec.futility)  # fmt: skip
    alpha = comparison_alpha(ALPHA, len(COMPARISONS), "familywise")
    out = grid_study(values, COMPARISONS, decide_spec(design, alpha), reader(design, 0.0, None), SEED_HOURS,
                     IMAGE_HOURS, images=design.images, max_images=SPLIT)  # fmt: skip
    calls = {key(p): out.looks[p].decision if out.looks[p].decision in ("better", "worse") else "none"
             for p in COMPARISONS}  # fmt: skip
    return Outcome(calls, out.hours), sum(out.seeds.values())


def scores_of(values: dict[str, np.ndarray], own_images: bool) -> dict[str, np.ndarray]:
    """Each run's score, its mean over ADASTOP_IMAGES images: the split's first 64 for every run (shared), or
    64 of its own, drawn past the split (fresh images for each run, as an RL agent's evaluation episodes are)."""
    if not own_images:
        return {a: x[:, :ADASTOP_IMAGES].mean(axis=1) for a, x in values.items()}
    out = {}
    for a, x in values.items():
        k = x.shape[0]
        own = x[:, SPLIT : SPLIT + k * ADASTOP_IMAGES].reshape(k, k, ADASTOP_IMAGES)  # seed, block, image
        out[a] = own[np.arange(k), np.arange(k)].mean(axis=1)  # seed s on block s
    return out


def level_check(n: int, k: int, alpha: float, sims: int = 1000) -> float:
    """AdaStop's rejection rate on one comparison of two identical arms (standard normal runs): its level."""
    from adastop import MultipleAgentsComparator

    rng = np.random.default_rng(0)
    rejected = 0
    for i in range(sims):
        pair = np.empty(1, dtype=object)
        pair[:] = [(0, 1)]
        comparator = MultipleAgentsComparator(n=n, K=k, B=10_000, comparisons=pair, alpha=alpha, seed=i)
        runs = {"a": rng.normal(size=n * k), "b": rng.normal(size=n * k)}
        for j in range(k):
            comparator.partial_compare({a: x[: (j + 1) * n] for a, x in runs.items()}, verbose=False)
            if comparator.is_finished:
                break
        rejected += comparator.decisions[str((0, 1))] in ("larger", "smaller")
    return rejected / sims


def adastop(values: dict[str, np.ndarray], n: int, k: int, alpha: float, seed: int,
            own_images: bool) -> tuple[Outcome, int]:  # fmt: skip
    """AdaStop over one study: each run one score (scores_of); `n` runs of every arm still in an open
    comparison per interim, at most `k` interims, at `alpha` as the library takes it."""
    from adastop import MultipleAgentsComparator

    index = {a: i for i, a in enumerate(ARMS)}
    # A 1-D array of tuples, not AdaStop's 2-D array of indices: it keys every comparison by str(comparison)
    # inside its permutation loops, and printing numpy rows was most of its time; a tuple's str is cheap.
    pairs = np.empty(len(COMPARISONS), dtype=object)
    pairs[:] = [(index[a], index[b]) for a, b in COMPARISONS]
    comparator = MultipleAgentsComparator(n=n, K=k, B=10_000, comparisons=pairs, alpha=alpha, seed=seed)
    scores = scores_of(values, own_images)
    trained = dict.fromkeys(ARMS, 0)
    for _ in range(k):
        current = comparator.current_comparisons
        needed = set(range(len(ARMS))) if current is None else {i for pair in current for i in pair}
        for a in ARMS:
            if index[a] in needed:
                trained[a] += n
        comparator.partial_compare({a: scores[a][: trained[a]] for a in ARMS}, verbose=False)
        if comparator.is_finished:
            break
    # "smaller": the arm's mean is below its comparator's (lower is better); "equal": no call.
    words = {"smaller": "better", "larger": "worse", "equal": "none", "continue": "none"}
    calls = {key(p): words[comparator.decisions[str(pairs[i])]] for i, p in enumerate(COMPARISONS)}
    hours = sum(trained[a] * (SEED_HOURS[a] + ADASTOP_IMAGES * IMAGE_HOURS) for a in ARMS)
    return Outcome(calls, hours), sum(trained.values())


@dataclass(frozen=True)
class Job:
    cell: Cell
    studies: int
    seed: int
    adastop_n: int
    adastop_k: int
    adastop_alpha: float


def run_job(job: Job) -> tuple[Cell, Tally]:
    spec = DecideSpec()
    rng = np.random.default_rng(job.seed)
    runs = job.adastop_n * job.adastop_k
    seeds = max(spec.max_seeds, runs)
    tally = Tally(studies=job.studies)
    for i in range(job.studies):
        # The split, then each possible AdaStop run's own 64 images (ours reads the split only).
        values = draw(rng, job.cell, Design(max_seeds=seeds, max_images=SPLIT + seeds * ADASTOP_IMAGES))
        tally.add("ours", *ours(values, spec))
        for method, own in METHODS.items():
            tally.add(method, *adastop(values, job.adastop_n, job.adastop_k, job.adastop_alpha,
                                       job.seed * 1000 + i, own))  # fmt: skip
    return job.cell, tally


def cells(quick: bool) -> Iterator[Cell]:
    for spread in (1.0, 3.0):
        for effect in (0.0075, 0.002):
            yield Cell("headline", spread, effect)
    if not quick:
        yield Cell("plain mean", 1.0, 0.0075)
        yield Cell("seed-dominated", 1.0, 0.0075)
    yield Cell("images alike", 1.0, 0.0075)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="200 studies a cell, the headline's cells and images alike")
    ap.add_argument("--studies", type=int, help="studies a cell (overrides --quick)")
    ap.add_argument("--workers", type=int, default=1, help="cells simulated in parallel")
    ap.add_argument("--adastop-n", type=int, default=2, help="AdaStop's runs of each arm per interim")
    ap.add_argument("--adastop-k", type=int, default=3, help="AdaStop's interims at most")
    ap.add_argument("--adastop-alpha", type=float, default=ALPHA / 2,
                    help="the alpha handed to adastop 0.1.3, whose two-sided test rejects at twice it (--level-check)")
    ap.add_argument("--level-check", action="store_true",
                    help="first print adastop's rejection rate on one null comparison at alpha and at alpha/2")
    args = ap.parse_args()
    if args.level_check:
        for n, k in ((5, 1), (2, 3), (3, 2)):
            rates = " and ".join(f"{level_check(n, k, a):.3f} at alpha {a:g}" for a in (ALPHA, ALPHA / 2))
            print(f"adastop {version('adastop')}, n={n}, K={k}: one null comparison rejected {rates} (1,000 each)")
    studies = args.studies or (200 if args.quick else 1000)
    start = time.monotonic()
    chunk = 100  # studies a job, each with its own RNG seed: the same table however many workers
    jobs = [Job(c, min(chunk, studies - lo), 70_000 + 1000 * i + lo // chunk, args.adastop_n, args.adastop_k,
                args.adastop_alpha) for i, c in enumerate(cells(args.quick)) for lo in range(0, studies, chunk)]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        parts = list(pool.map(run_job, jobs))
    by_cell: dict[Cell, Tally] = {}
    for cell, tally in parts:
        by_cell[cell] = merged(by_cell[cell], tally) if cell in by_cell else tally
    spec = DecideSpec()
    print(f"{studies} studies a cell; ours: DecideSpec() (seeds {spec.min_seeds}-{spec.max_seeds}, images 64-{SPLIT}, "
          f"alpha {ALPHA} familywise: {comparison_alpha(ALPHA, len(COMPARISONS), 'familywise'):g} a comparison); "
          f"AdaStop: {args.adastop_n} runs an interim, at most {args.adastop_k} interims, {ADASTOP_IMAGES} images, "
          f"alpha {args.adastop_alpha:g} handed to adastop {version('adastop')} (its two-sided test rejects at "
          f"twice that: --level-check)")  # fmt: skip
    print("| profile | D's seed SD | effect | method | familywise error | power C-B / C-A / D-A | GPU-h a study | "
          "arm-seeds a study |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    head: dict[str, list[float]] = {}
    for cell, t in by_cell.items():
        for m in ("ours", *METHODS):
            fwer, hours = t.wrong.get(m, 0) / t.studies, t.hours.get(m, 0.0) / t.studies
            power = [t.called.get((m, k), 0) / t.studies for k in BETTER]
            print(f"| {cell.profile} | {cell.spread:g}x | {cell.effect} | {m} | {fwer:.3f} | "
                  f"{' / '.join(f'{p:.3f}' for p in power)} | {hours:.1f} | {t.runs.get(m, 0) / t.studies:.1f} |",
                  flush=True)  # fmt: skip
            if cell.profile == "headline":
                head.setdefault(f"hours {m}", []).append(hours)
                head.setdefault(f"fwer {m}", []).append(fwer)
                head.setdefault(f"power {m}", []).append(float(np.mean(power)))
    se = math.sqrt(ALPHA * (1 - ALPHA) / studies)
    print(f"({time.monotonic() - start:.0f} s; a familywise error's SE at {ALPHA} is {se:.4f} at {studies} studies; "
          f"the line below: the headline cells, AdaStop with each run scored on its own images, then its "
          f"familywise error scored on the shared images)")  # fmt: skip
    ada = "adastop own images"
    print(f"ours_gpu_hours {np.mean(head['hours ours']):.1f} adastop_gpu_hours {np.mean(head[f'hours {ada}']):.1f} "
          f"fwer_ours {max(head['fwer ours']):.4f} fwer_adastop {max(head[f'fwer {ada}']):.4f} "
          f"power_ours {np.mean(head['power ours']):.3f} power_adastop {np.mean(head[f'power {ada}']):.3f} "
          f"fwer_adastop_shared_images {max(head['fwer adastop shared images']):.4f}")


if __name__ == "__main__":
    main()
