"""Does the noise budget's seed share read the truth on average? Known-truth tables of paired differences
(k seeds x n images: seed + image + rest, normal, SDs of the difference; image 0.011 and rest 0.004, issue
56's mixed profile, and the seed SD set so the seeds' share of the grand mean's variance is the true share),
each read by the product's own crossed.py `components`. Per cell: the mean over the tables of the clipped
share (main 5f9a402's printed point: the ANOVA seed component, zero where its mean square came out below the
rest's), of the share the budget prints now and the chooser prices a seed at (`Components.priced_share`:
the seed component's median given its mean square and that it is not negative), and how often the budget's
"up to" (the seed mean square at its 90% upper bound) is at or above the true share.

    python bench/seed_share.py            # 2000 tables a cell
    python bench/seed_share.py --quick    # 300 a cell

The last line reads `seed_share <the largest |mean printed - true| at POINT_SEEDS (4) seeds or more, where
the budget prints the share as the seeds'> (clipped <its largest>)`; the line before gives it per k (under
4 seeds the printed share is the "priced at").
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from orchestrator.results.reports.crossed import POINT_SEEDS, components

IMAGE_SD, REST_SD = 0.011, 0.004
SEEDS, IMAGES, TRUTHS = (2, 3, 4, 5, 8), (64, 256), (0.1, 0.4, 0.5, 0.77, 0.9, 0.98)


def seed_sd(share: float, k: int, n: int) -> float:
    """The difference's seed SD at which the seeds hold `share` of the grand mean's variance."""
    others = IMAGE_SD**2 / n + REST_SD**2 / (k * n)
    return float((share / (1 - share) * others * k) ** 0.5)


def cell(k: int, n: int, share: float, tables: int, seed: int = 0) -> dict[str, float]:
    """Mean clipped share, mean printed share and the bound's coverage over `tables` known-truth tables."""
    rng = np.random.default_rng([k, n, int(share * 1000), seed])
    sd = seed_sd(share, k, n)
    clipped, printed, held = [], [], 0
    for _ in range(tables):
        table = rng.normal(0, sd, (k, 1)) + rng.normal(0, IMAGE_SD, (1, n)) + rng.normal(0, REST_SD, (k, n))
        c = components(table.tolist())
        assert c is not None
        clipped.append(c.shares()[0])
        printed.append(c.priced_share())
        held += c.seed_share_with(c.seed_high) >= share
    return {"clipped": float(np.mean(clipped)), "printed": float(np.mean(printed)), "bound": held / tables}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="300 tables a cell instead of 2000")
    ap.add_argument("--tables", type=int, help="tables a cell (overrides --quick)")
    args = ap.parse_args()
    tables = args.tables or (300 if args.quick else 2000)
    start = time.monotonic()
    print(f"{tables} tables a cell; image SD {IMAGE_SD}, rest SD {REST_SD}")
    print("| images | seeds | true share | clipped (main): mean | printed now: mean | up to >= true |")
    print("|---|---|---|---|---|---|")
    worst: dict[int, tuple[float, float]] = {}
    for n in IMAGES:
        for k in SEEDS:
            for share in TRUTHS:
                got = cell(k, n, share, tables)
                print(f"| {n} | {k} | {share:.0%} | {got['clipped']:.3f} | {got['printed']:.3f} | {got['bound']:.3f} |")
                was, now = worst.get(k, (0.0, 0.0))
                worst[k] = (max(was, abs(got["clipped"] - share)), max(now, abs(got["printed"] - share)))
    print(f"({time.monotonic() - start:.0f} s)")
    print("; ".join(f"k={k}: printed {now:.3f} (clipped {was:.3f})" for k, (was, now) in worst.items()))
    print(f"seed_share {max(worst[k][1] for k in worst if k >= POINT_SEEDS):.3f} "
          f"(clipped {max(worst[k][0] for k in worst if k >= POINT_SEEDS):.3f})")  # fmt: skip


if __name__ == "__main__":
    main()
