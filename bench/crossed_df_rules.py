"""Two df rules for the crossed seeds x images interval side by side (issue 58), on Gaussian tables with named
components, vectorised in numpy (a proxy of orchestrator/results/reports/crossed.py's paired reading, which
bench/interval_coverage.py and bench/distribution_sim.py check through the product's own code):
- whole: Satterthwaite's df with the whole seed mean square at its 75% upper bound on k - 1 df (issue 56);
- component: the seed component at that bound (the bound less the rest's mean square) on k - 1 df, the rest on
  its own df (crossed.py since afbe00e).
Either way the df is the fewer of that and Satterthwaite's over the mean squares kept; the SE is the same.

    python bench/crossed_df_rules.py            # 8000 tables a cell, seeded: about 30 s
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy import stats
from scipy.special import chdtri

BOUND = 0.25  # crossed.py SEED_DF_BOUND
CELLS = {  # name: (k, n, seed SD, image SD, rest SD)
    "3x arm, k = 3, n = 64": (3, 64, 0.002 * 5**0.5, 0.011, 0.004),
    "3x arm, k = 2, n = 64": (2, 64, 0.002 * 5**0.5, 0.011, 0.004),
    "plain mean, k = 3, n = 256": (3, 256, 0.0083, 0.044, 0.0106),
    "CMMD-like (image 0.4, rest 0.6, no seed), k = 3, n = 500": (3, 500, 0.0, 0.4**0.5, 0.6**0.5),
    "the same, seeds a quarter": (3, 500, 0.02, 0.4**0.5, 0.6**0.5),
    "the same, k = 4": (4, 500, 0.0, 0.4**0.5, 0.6**0.5),
    "no image noise, k = 3": (3, 64, 0.002, 0.0, 0.004),
    "seeds dominant, k = 3": (3, 64, 0.01, 0.001, 0.002),
}


def _satterthwaite(terms: list[tuple]) -> np.ndarray:
    total = sum(c * m for c, m, _ in terms)
    spread = sum((c * m) ** 2 / d for c, m, d in terms)
    return np.where(spread > 0, total**2 / np.where(spread > 0, spread, 1), np.inf)


def coverage(rng: np.random.Generator, k: int, n: int, seed: float, image: float, rest: float, reps: int,
             component: bool) -> float:  # fmt: skip
    t = rng.normal(0, seed, (reps, k, 1)) + rng.normal(0, image, (reps, 1, n)) + rng.normal(0, rest, (reps, k, n))
    grand, rows, cols = t.mean((1, 2)), t.mean(2), t.mean(1)
    ms_seed = n * ((rows - grand[:, None]) ** 2).sum(1) / (k - 1)
    resid = t - rows[:, :, None] - cols[:, None, :] + grand[:, None, None]
    ms_rest = (resid**2).sum((1, 2)) / ((k - 1) * (n - 1))
    images_ms = ((cols - grand[:, None]) ** 2).sum(1) / (n - 1)
    s_kept = (ms_seed > ms_rest).astype(float)
    i_kept = (images_ms > ms_rest / k).astype(float)
    se = np.sqrt(np.maximum(ms_seed - ms_rest, 0) / n / k + np.maximum(images_ms - ms_rest / k, 0) / n
                 + ms_rest / (k * n))  # fmt: skip
    kept = _satterthwaite([(i_kept, images_ms, n - 1), (s_kept / k, ms_seed, k - 1),
                           ((1 - s_kept - i_kept) / k, ms_rest, (k - 1) * (n - 1))])  # fmt: skip
    upper = ms_seed * (k - 1) / chdtri(k - 1, 1 - BOUND)
    if component:
        bounded = _satterthwaite([(i_kept, images_ms, n - 1), (1 / k, np.maximum(upper - ms_rest, 0), k - 1),
                                  ((1 - i_kept) / k, ms_rest, (k - 1) * (n - 1))])  # fmt: skip
    else:
        bounded = _satterthwaite([(i_kept, images_ms, n - 1), (1 / k, upper, k - 1),
                                  (-i_kept / k, ms_rest, (k - 1) * (n - 1))])  # fmt: skip
    df = np.minimum(kept, bounded)
    q = stats.t.ppf(0.975, np.where(np.isfinite(df), df, 1e9))
    return float(np.mean(np.abs(grand) <= q * se))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=8000)
    args = ap.parse_args()
    print(f"{args.reps} tables a cell, 95% nominal\n\n| cell | whole mean square bounded | component bounded |\n"
          "|---|---|---|")
    for i, (name, cell) in enumerate(CELLS.items()):
        got = [coverage(np.random.default_rng(i), *cell, args.reps, component) for component in (False, True)]
        print(f"| {name} | {got[0]:.3f} | {got[1]:.3f} |", flush=True)


if __name__ == "__main__":
    main()
