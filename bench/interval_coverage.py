"""Does the effects table's interval cover? Simulated k x n tables of paired differences with known
seed, image and rest components (d[s][i] = effect + a_s + b_i + e_si, all normal), each read by the
report's own code (orchestrator/results/reports/stats.py across_seeds), counting how often the 95%
interval holds the true effect: the crossed seeds x images interval against the seed-only t-interval the
report used before it (the k per-seed means on k - 1 df, which leaves the images out).

The grid of cells holds the measured components of issue 47's A/C grid (four H100s, small size, 64
images): the weighted headline's difference (seed SD 0.00097, image SD 0.0114, rest SD 0.00175) and the
plain mean's (0.0083, 0.044, 0.0106), and the corners: no image noise, no seed noise, seeds dominant.

    python bench/interval_coverage.py            # 4000 tables a cell (coverage SE about 0.35%)
    python bench/interval_coverage.py --quick    # 2000 a cell: about half a minute on 2 cores

The last line reads `crossed coverage <lowest over the cells with k >= 3> (seed-only <lowest>)`; the
k = 2 cells are printed too and their lowest named on its own line.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from orchestrator.results.reports.stats import Difference, across_seeds, t_quantile

# (name, seed SD, image SD, rest SD)
PROFILES = (
    ("weighted, measured", 0.00097, 0.0114, 0.00175),
    ("plain mean, measured", 0.0083, 0.044, 0.0106),
    ("no image noise", 0.002, 0.0, 0.004),
    ("no seed noise", 0.0, 0.0114, 0.00175),
    ("seeds dominant", 0.01, 0.001, 0.002),
)
KS = (2, 3, 4, 8)
NS = (16, 64, 256)
EFFECT = 0.007


def seed_only(diffs: list[float]) -> tuple[float, float]:
    """The former interval: a t-interval over the k per-seed means on k - 1 df."""
    k = len(diffs)
    mean = sum(diffs) / k
    se = math.sqrt(sum((x - mean) ** 2 for x in diffs) / (k - 1) / k)
    half = t_quantile(k - 1) * se
    return mean - half, mean + half


def cell(rng: np.random.Generator, k: int, n: int, seed_sd: float, image_sd: float, rest_sd: float,
         reps: int) -> tuple[float, float, float]:  # fmt: skip
    """(crossed coverage, seed-only coverage, median crossed width / seed-only width) over `reps` tables."""
    hits_crossed = hits_seed = 0
    ratios = []
    for _ in range(reps):
        table = (EFFECT + rng.normal(0, seed_sd, (k, 1)) + rng.normal(0, image_sd, (1, n))
                 + rng.normal(0, rest_sd, (k, n)))  # fmt: skip
        rows = table.tolist()
        per_seed = [Difference(sum(r) / n, None, None, None, "paired", n, samples=tuple(r)) for r in rows]
        effect = across_seeds(per_seed)
        assert effect is not None and effect.interval == "crossed" and effect.low is not None
        hits_crossed += effect.low <= EFFECT <= effect.high  # type: ignore[operator]
        lo, hi = seed_only([e.diff for e in per_seed])
        hits_seed += lo <= EFFECT <= hi
        ratios.append((effect.high - effect.low) / (hi - lo) if hi > lo else math.inf)  # type: ignore[operator]
    return hits_crossed / reps, hits_seed / reps, float(np.median(ratios))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2000 tables a cell instead of 4000")
    ap.add_argument("--reps", type=int, help="tables a cell (overrides --quick)")
    args = ap.parse_args()
    reps = args.reps or (2000 if args.quick else 4000)
    rng = np.random.default_rng(47)
    print(f"{reps} tables a cell, true effect {EFFECT}, 95% nominal")
    print("| profile | seed SD | image SD | rest SD | k | n | crossed | seed-only | width ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    low3, low3_seed, low2 = 1.0, 1.0, 1.0
    start = time.monotonic()
    for name, s_sd, i_sd, r_sd in PROFILES:
        for k in KS:
            for n in NS:
                crossed, seed, ratio = cell(rng, k, n, s_sd, i_sd, r_sd, reps)
                if k >= 3:
                    low3, low3_seed = min(low3, crossed), min(low3_seed, seed)
                else:
                    low2 = min(low2, crossed)
                print(f"| {name} | {s_sd} | {i_sd} | {r_sd} | {k} | {n} | {crossed:.3f} | {seed:.3f} | {ratio:.1f}x |",
                      flush=True)  # fmt: skip
    print(f"({time.monotonic() - start:.0f} s)")
    print(f"k = 2: crossed coverage {low2:.3f} at the lowest")
    print(f"crossed coverage {low3:.3f} (seed-only {low3_seed:.3f})")


if __name__ == "__main__":
    main()
