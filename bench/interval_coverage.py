"""Does the effects table's interval cover? Simulated seeds x images tables with known seed, image and rest
components, each read by the report's own code, counting how often the 95% interval holds the true effect:
the crossed seeds x images interval (orchestrator/results/reports/stats.py across_seeds where the two arms
ran the same seeds, across_arms, the unpaired reading, where they did not), against the seed-only
t-interval the report used before it (the k per-seed means on k - 1 df, which leaves the images out).

Each arm's value on seed s and image i is mean + seed_s + image_i + rest_si, each arm its own draw (a
profile's SDs are the difference's: each arm's seed and rest SD is theirs / sqrt 2, and the image SD is the
arm's own response to an image, what both share cancelling). The cells:
- the measured components of issue 47's A/C grid (four H100s, small size, 64 images): the weighted
  headline's difference (seed SD 0.00097, image SD 0.0114, rest SD 0.00175) and the plain mean's (0.0083,
  0.044, 0.0106), and the corners: no image noise, no seed noise, seeds dominant;
- issue 56's: the mixed (0.002 / 0.011 / 0.004) and seed-dominated (0.006 / 0.0015 / 0.006) profiles with
  the arm's seed SD 3x the control's ("3x"); the same with every draw from Student's t on 3 df scaled to
  the same SD ("t3": heavy tails); with a seed x image interaction (each seed of the arm its own slope on
  the images, SD 0.004 at the mean image: "interaction"); and unbalanced, the control on more seeds than
  the arm (what a deciding grid does when another comparison asks the control for a seed), equal and 3x.

    python bench/interval_coverage.py            # 4000 tables a cell (coverage SE about 0.35%), on every core
    python bench/interval_coverage.py --quick    # 1000 a cell
    python bench/interval_coverage.py --group 3x --group unbalanced   # some of the cells
    git worktree add /tmp/before 8413b5c && PYTHONPATH=/tmp/before python bench/interval_coverage.py --paired-only
                                                 # the same cells as main 8413b5c read them

The last lines read `k = 2: crossed coverage <lowest at k = 2>` and `crossed coverage <lowest over the
cells with k >= 3> (seed-only <lowest>)`, k being the fewer of the two arms' seeds; the lowest of each of
issue 56's groups is printed above them.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from orchestrator.results.reports.stats import Difference, across_seeds, t_quantile

EFFECT = 0.007


@dataclass(frozen=True)
class Profile:
    name: str
    seed_sd: float  # the difference's, each arm seed_sd / sqrt 2 (the arm's times `spread`)
    image_sd: float
    rest_sd: float
    spread: float = 1.0  # the arm's seed SD over the control's
    tails: str = "normal"  # or "t3": Student's t on 3 df, scaled to the same SD
    interaction_sd: float = 0.0  # the arm's seed x image interaction: seed s's slope on image i's difficulty


@dataclass(frozen=True)
class Cell:
    group: str
    profile: Profile
    k: int  # the arm's seeds
    k_other: int  # the control's
    n: int


MEASURED = (
    Profile("weighted, measured", 0.00097, 0.0114, 0.00175),
    Profile("plain mean, measured", 0.0083, 0.044, 0.0106),
    Profile("no image noise", 0.002, 0.0, 0.004),
    Profile("no seed noise", 0.0, 0.0114, 0.00175),
    Profile("seeds dominant", 0.01, 0.001, 0.002),
)
MIXED, SEEDS = ("mixed", 0.002, 0.011, 0.004), ("seed-dominated", 0.006, 0.0015, 0.006)
KS = (2, 3, 4, 8)
NS = (16, 64, 256)
UNBALANCED = ((2, 3), (2, 4), (3, 4), (3, 6), (4, 6))  # (the arm's seeds, the control's)


def cells() -> list[Cell]:
    out = [Cell("measured", p, k, k, n) for p in MEASURED for k in KS for n in NS]
    for name, s, i, r in (MIXED, SEEDS):
        out += [Cell("3x", Profile(name, s, i, r, spread=3), k, k, n) for k in KS for n in NS]
        out += [Cell("t3", Profile(name, s, i, r, spread=3, tails="t3"), k, k, n) for k in KS for n in NS]
        out += [Cell("unbalanced", Profile(name, s, i, r, spread=spread), k, k_other, n)
                for spread in (1, 3) for k, k_other in UNBALANCED for n in NS]  # fmt: skip
    name, s, i, r = MIXED
    out += [Cell("interaction", Profile(name, s, i, r, interaction_sd=0.004), k, k, n) for k in KS for n in NS]
    return out


def drawer(rng: np.random.Generator, tails: str) -> Callable[[tuple[int, ...]], np.ndarray]:
    """Unit-variance draws: normal, or Student's t on 3 df over sqrt 3 (its SD)."""
    if tails == "t3":
        return lambda shape: rng.standard_t(3, shape) / math.sqrt(3)
    return lambda shape: rng.standard_normal(shape)


def arms(rng: np.random.Generator, c: Cell) -> tuple[np.ndarray, np.ndarray]:
    """(the arm's k x n table, the control's k_other x n) with the true effect in the arm."""
    p, draw = c.profile, drawer(rng, c.profile.tails)
    seed, rest = p.seed_sd / math.sqrt(2), p.rest_sd / math.sqrt(2)
    arm = (EFFECT + p.spread * seed * draw((c.k, 1)) + p.image_sd * draw((1, c.n)) + rest * draw((c.k, c.n))
           + p.interaction_sd * draw((c.k, 1)) * draw((1, c.n)))  # fmt: skip
    return arm, seed * draw((c.k_other, 1)) + rest * draw((c.k_other, c.n))


def seed_only(diffs: list[float]) -> tuple[float, float]:
    """The former interval: a t-interval over the k per-seed means on k - 1 df."""
    k = len(diffs)
    mean = sum(diffs) / k
    se = math.sqrt(sum((x - mean) ** 2 for x in diffs) / (k - 1) / k)
    half = t_quantile(k - 1) * se
    return mean - half, mean + half


def coverage(index: int, c: Cell, reps: int, paired_only: bool = False) -> tuple[float, float | None]:
    """(crossed coverage, seed-only coverage; None where the arms ran different seeds) over `reps` tables,
    drawn from the cell's own seed (the same numbers whatever cells run beside it). `paired_only`: read the
    seeds both arms ran, seed s against seed s, dropping the control's extra ones (main 8413b5c's reading)."""
    rng = np.random.default_rng([47, index])
    hits_crossed = hits_seed = 0
    for _ in range(reps):
        arm, other = arms(rng, c)
        if c.k == c.k_other or paired_only:
            rows = (arm - other[: c.k]).tolist()
            per_seed = [Difference(sum(r) / c.n, None, None, None, "paired", c.n, samples=tuple(r)) for r in rows]
            effect = across_seeds(per_seed)
            lo, hi = seed_only([d.diff for d in per_seed])
            hits_seed += lo <= EFFECT <= hi
        else:
            from orchestrator.results.reports.stats import across_arms  # lazily: absent from 8413b5c's tree

            effect = across_arms(arm.tolist(), other.tolist())
        assert effect is not None and effect.interval == "crossed" and effect.low is not None
        hits_crossed += effect.low <= EFFECT <= effect.high  # type: ignore[operator]
    return hits_crossed / reps, (hits_seed / reps if c.k == c.k_other else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1000 tables a cell instead of 4000")
    ap.add_argument("--reps", type=int, help="tables a cell (overrides --quick)")
    ap.add_argument("--group", action="append", help="only these groups (measured, 3x, t3, unbalanced, interaction)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes (default: every core)")
    ap.add_argument("--paired-only", action="store_true",
                    help="read the unbalanced cells on the seeds both arms ran (main 8413b5c's reading; with its tree "
                         "first on PYTHONPATH, its whole interval)")  # fmt: skip
    args = ap.parse_args()
    reps = args.reps or (1000 if args.quick else 4000)
    print(f"{reps} tables a cell, true effect {EFFECT}, 95% nominal")
    print("| group | profile (seed / image / rest SD) | arm seed SD / control's | tails | k arm / control | n "
          "| crossed | seed-only |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    low3, low3_seed, low2 = 1.0, 1.0, 1.0
    by_group: dict[str, tuple[float, float]] = {}  # group: (lowest at k >= 3, at k = 2)
    start = time.monotonic()
    chosen = [(i, c) for i, c in enumerate(cells()) if not args.group or c.group in args.group]
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(coverage, [i for i, _ in chosen], [c for _, c in chosen], [reps] * len(chosen),
                                [args.paired_only] * len(chosen)))
    for (_, c), (crossed, seed) in zip(chosen, results, strict=True):
        p = c.profile
        g3, g2 = by_group.get(c.group, (1.0, 1.0))
        if c.k >= 3:
            low3, g3 = min(low3, crossed), min(g3, crossed)
            low3_seed = min(low3_seed, seed) if seed is not None else low3_seed
        else:
            low2, g2 = min(low2, crossed), min(g2, crossed)
        by_group[c.group] = (g3, g2)
        extra = f", interaction {p.interaction_sd}" if p.interaction_sd else ""
        seed_cell = f"{seed:.3f}" if seed is not None else "-"  # not read on the arms' different seeds
        print(f"| {c.group} | {p.name} ({p.seed_sd} / {p.image_sd} / {p.rest_sd}{extra}) | {p.spread:g}x | {p.tails} "
              f"| {c.k} / {c.k_other} | {c.n} | {crossed:.3f} | {seed_cell} |", flush=True)  # fmt: skip
    print(f"({time.monotonic() - start:.0f} s)")
    for group, (g3, g2) in by_group.items():
        print(f"{group}: crossed coverage {g3:.3f} at the lowest with k >= 3, {g2:.3f} with k = 2")
    print(f"k = 2: crossed coverage {low2:.3f} at the lowest")
    print(f"crossed coverage {low3:.3f} (seed-only {low3_seed:.3f})")


if __name__ == "__main__":
    main()
