"""A campaign of grids of the same arms, each borrowing its arms' seed variances from the ones before
(`decide.borrow_from: "auto"`): what it spends against fixed 3-seed grids throughout, and whether each
follow-up's comparisons hold their error rate. Issue 56, item 7.

The first grid runs arms A-D at 3 fixed seeds on 64 images. Then three follow-ups of the same arms decide
(bench/decide_sim.py's study, its profiles, costs and truth: B-A and D-C null, the others differ by the
effect) from one seed (min_seeds 1), each comparison read as the product reads it (results/deciding/borrowed.py
`borrowed_reading` with its SPREAD_FLOOR): each arm's seed variance pooled over every earlier grid of the
campaign whose runs of that arm were measured on the images the look reads (auto's match: the same images;
a grid that evaluated more images lends to a look on as many), pooled with the comparison's own seeds from
two on. A follow-up's arm that ran two or more seeds lends its spread to the next. Each grid draws new
seeds and images from the same model (the same code and data: what auto matches on).

    python bench/decide_campaign.py --quick     # 200 campaigns a cell; ends with the line below

The last line: `campaign_gpu_hours_vs_fixed3 <largest ratio over the headline's cells> type_I <largest
share of null comparisons called in any follow-up, any cell> power <lowest ratio of a follow-up's power to
the fixed design's on the same studies, over the headline's cells>`.
"""

from __future__ import annotations

import argparse
import math
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from decide_looks import TableReading, grid_study
from decide_sim import (
    ALPHA,
    ARMS,
    COMPARISONS,
    EFFECTS,
    FIXED_IMAGES,
    FIXED_SEEDS,
    IMAGE_HOURS,
    NULL,
    SEED_HOURS,
    Cell,
    Design,
    Reading,
    borrowed_of,
    correct,
    decide_spec,
    draw,
    fixed_hours,
    read,
)

from orchestrator.results.deciding.borrowed import (
    SPREAD_FLOOR,
    RefusedBorrow,
    SeedVariance,
    difference_of,
    pooled_arms,
    run_spread,
)
from orchestrator.results.deciding.sequential import (
    FUTILITY,
)
from orchestrator.results.reports.crossed import crossed_interval
from orchestrator.results.reports.stats import t_quantile

FOLLOW_UPS = 3
# arm -> what each earlier grid of the campaign lends it: (the images its runs were measured on, their spread)
Lenders = dict[str, list[tuple[int, SeedVariance]]]


@dataclass
class Tally:
    campaigns: int = 0
    hours: float = 0.0  # the campaign's: the first grid and its follow-ups
    nulls_called: list[int] = field(default_factory=lambda: [0] * FOLLOW_UPS)  # per follow-up
    power: list[int] = field(default_factory=lambda: [0] * FOLLOW_UPS)  # non-null called right, per follow-up
    power_fixed: int = 0  # the fixed design's on the follow-ups' studies
    refused: int = 0  # looks whose borrowed variance the floor refused


def merged(a: Tally, b: Tally) -> Tally:
    return Tally(a.campaigns + b.campaigns, a.hours + b.hours,
                 [x + y for x, y in zip(a.nulls_called, b.nulls_called, strict=True)],
                 [x + y for x, y in zip(a.power, b.power, strict=True)], a.power_fixed + b.power_fixed,
                 a.refused + b.refused)  # fmt: skip


def lent(lenders: Lenders, arm: str, n: int) -> SeedVariance | None:
    """An arm's seed variance pooled over the earlier grids whose runs of it were measured on n images."""
    return pooled_arms([v for images, v in lenders.get(arm, []) if images == n])


def reading(diff: np.ndarray, earlier: SeedVariance | None, design: Design, tally: Tally) -> Reading | None:
    """The comparison's k x n differences read as a grid with borrow_from reads them (decider.borrowed_look);
    without a borrowed variance (none, or refused) its own crossed interval from two seeds on, else None (one
    seed and nothing to borrow: no interval, one more seed)."""
    if earlier is not None:
        try:
            return borrowed_of(diff, earlier, design, floor=SPREAD_FLOOR)
        except RefusedBorrow:
            tally.refused += 1
    return read(diff, design, 0.0) if diff.shape[0] >= 2 else None


def follow_up(values: dict[str, np.ndarray], lenders: Lenders, design: Design, tally: Tally, index: int
              ) -> tuple[dict[str, int], dict[str, int]]:  # fmt: skip
    """One deciding grid of the campaign (decide_sim's study, read with the campaign's borrowed variances);
    returns each arm's seeds and images at its end."""

    def read_pair(diff: np.ndarray, p: tuple[str, str], runs: object = None) -> TableReading:  # borrows: runs unread
        n = diff.shape[1]
        r = reading(diff, difference_of(lent(lenders, p[0], n), lent(lenders, p[1], n)), design, tally)
        if r is None:  # one seed, nothing to borrow: the decider takes a seed ("no interval across seeds")
            return TableReading(float(diff.mean()), None, None, None)
        return TableReading(r.mean, r.se, r.df, r.variance)

    out = grid_study(values, COMPARISONS, decide_spec(design), read_pair, SEED_HOURS, IMAGE_HOURS,
                     images=design.images, max_images=design.max_images)  # fmt: skip
    for p in COMPARISONS:
        c = out.looks[p]
        if c.decision in ("better", "worse"):
            if p in NULL:
                tally.nulls_called[index] += 1
            elif c.decision == "better":
                tally.power[index] += 1
    seeds, evaluated = out.seeds, dict.fromkeys(ARMS, out.images)
    tally.hours += out.hours
    for p in COMPARISONS:  # the fixed design on the same study, for power
        if p not in NULL:
            table = (values[p[0]][:FIXED_SEEDS, :FIXED_IMAGES] - values[p[1]][:FIXED_SEEDS, :FIXED_IMAGES]).tolist()
            ci = crossed_interval(table, t_quantile)
            assert ci is not None
            tally.power_fixed += correct(p, ci.low, ci.high)
    return seeds, evaluated


def lend(lenders: Lenders, values: dict[str, np.ndarray], seeds: dict[str, int], images: dict[str, int]) -> None:
    """A grid's arms that ran two seeds or more lend their runs' spread on the images they were measured on."""
    for arm in ARMS:
        k, n = seeds[arm], images[arm]
        spread = run_spread(values[arm][:k, :n].mean(axis=1).tolist()) if k >= 2 else None
        if spread is not None:
            lenders.setdefault(arm, []).append((n, spread))


def run_cell(args: tuple[Cell, Design, int, int]) -> tuple[Cell, Tally]:
    cell, design, campaigns, seed = args
    rng = np.random.default_rng(seed)
    tally = Tally(campaigns=campaigns)
    for _ in range(campaigns):
        lenders: Lenders = {}
        first = draw(rng, cell, design)
        lend(lenders, first, dict.fromkeys(ARMS, FIXED_SEEDS), dict.fromkeys(ARMS, FIXED_IMAGES))
        tally.hours += fixed_hours()
        for i in range(FOLLOW_UPS):
            values = draw(rng, cell, design)
            seeds, images = follow_up(values, lenders, design, tally, i)
            lend(lenders, values, seeds, images)
    return cell, tally


def cells() -> list[Cell]:
    """The headline's and the plain mean's profiles, arm D's seeds at 1x and 3x the others' spread, both effects."""
    return [Cell(p, s, e) for p in ("headline", "plain mean") for s in (1.0, 3.0) for e in EFFECTS]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="200 campaigns a cell instead of 2,000")
    ap.add_argument("--campaigns", type=int, help="campaigns a cell (overrides --quick)")
    ap.add_argument("--workers", type=int, default=2, help="cells simulated in parallel")
    ap.add_argument("--max-seeds", type=int, default=3,
                    help="the follow-ups' max_seeds (3: the design docs/benchmarks.md records; DecideSpec's is 8)")
    args = ap.parse_args()
    campaigns = args.campaigns or (200 if args.quick else 2000)
    design = Design(min_seeds=1, max_seeds=args.max_seeds, futility=FUTILITY)
    start = time.monotonic()
    chunk = 50
    jobs = [(c, design, min(chunk, campaigns - lo), 70_000 + 1000 * i + lo // chunk)
            for i, c in enumerate(cells()) for lo in range(0, campaigns, chunk)]  # fmt: skip
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        parts = list(pool.map(run_cell, jobs))
    by_cell: dict[Cell, Tally] = {}
    for cell, tally in parts:
        by_cell[cell] = merged(by_cell[cell], tally) if cell in by_cell else tally
    fixed = (1 + FOLLOW_UPS) * fixed_hours()
    print(f"{campaigns} campaigns a cell: a fixed {FIXED_SEEDS}-seed grid, then {FOLLOW_UPS} follow-ups borrowing "
          f"from every earlier grid (min_seeds 1, max_seeds {design.max_seeds}); fixed throughout {fixed:.1f} GPU-h; "
          f"alpha {ALPHA} per comparison")  # fmt: skip
    print("| profile | D's seed SD | effect | GPU-h vs fixed throughout | null called per follow-up | "
          "power per follow-up (fixed) | floor refusals per campaign |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    worst_hours, worst_type1, worst_power = 0.0, 0.0, math.inf
    for cell, t in by_cell.items():
        ratio = t.hours / t.campaigns / fixed
        nulls = [x / (len(NULL) * t.campaigns) for x in t.nulls_called]
        effects = (len(COMPARISONS) - len(NULL)) * t.campaigns
        powers = [x / effects for x in t.power]
        fixed_power = t.power_fixed / (effects * FOLLOW_UPS)
        worst_type1 = max(worst_type1, *nulls)
        if cell.profile == "headline":  # the metric a grid decides on (the plain mean's power is near zero)
            worst_hours = max(worst_hours, ratio)
            worst_power = min(worst_power, *(p / fixed_power for p in powers)) if fixed_power > 0 else worst_power
        print(f"| {cell.profile} | {cell.spread:g}x | {cell.effect} | {ratio:.3f} | "
              f"{' / '.join(f'{x:.4f}' for x in nulls)} | {' / '.join(f'{x:.3f}' for x in powers)} "
              f"({fixed_power:.3f}) | {t.refused / t.campaigns:.3f} |", flush=True)  # fmt: skip
    print(f"({time.monotonic() - start:.0f} s)")
    print(f"campaign_gpu_hours_vs_fixed3 {worst_hours:.3f} type_I {worst_type1:.4f} power {worst_power:.3f}")


if __name__ == "__main__":
    main()
