"""A comparison read with its arms' seed variance borrowed from earlier grids of the same arms: the way a
grid that decides can close a comparison on one or two seeds without betting on one degree of freedom.

Why: with k seeds a comparison's own seed variance rests on k - 1 df, so a look at two seeds reads t on
about one df and decides almost nothing (docs/benchmarks.md, issue 50). An earlier grid that ran the same
arm (the same spec, any seeds) measured that arm's seed-to-seed spread on its own k0 - 1 df, and the two
estimates pool. It must be each arm's own: a variance borrowed from the control, or pooled over arms,
undercovers an arm whose seeds spread more (in bench/decide_sim.py, an arm with 3x the seed SD had 9% of
its null comparisons called at alpha 5%). A check guards a borrowed variance that no longer fits: where
the comparison's own seeds spread more than the borrowed variance's upper F bound at `check`, its own is
read alone.

The reading, for arm a against arm b on k paired seeds and n images (the report's crossed table): the
difference of the grand means has variance S/k + I, where S is the seed variance of a paired difference
(arm a's plus arm b's) and I the images' and the rest's part of the mean's variance. S is estimated by
the table's MS_seed/n (the per-seed mean differences' spread, on k - 1 df), by the earlier grids' per-arm
variances summed (each the spread of that arm's earlier runs' values, on Satterthwaite's df), or by both
pooled on the sum of their df. Satterthwaite's df over S/k and I. Pure: no service.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

DF_QUANTILE = 0.1  # the seed term's upper bound the df is read at (borrowed_reading)
CHECK = 0.1  # the check's level: the comparison's own seed variance above the borrowed one's 90% F bound


@dataclass(frozen=True)
class SeedVariance:
    """A seed variance estimate on `df` degrees of freedom (a chi-square's, or Satterthwaite's)."""

    value: float
    df: float


@dataclass(frozen=True)
class SeedReading:
    """What a comparison's seed variance rests on at a look."""

    variance: SeedVariance  # what the reading used
    own: SeedVariance | None  # the comparison's own seeds (None with one)
    earlier: SeedVariance | None  # both arms' earlier grids, summed (None where either arm has none)
    borrowed: bool  # False where there was none to borrow or the check refused it
    note: str


@dataclass(frozen=True)
class BorrowedReading:
    se: float
    df: float
    seeds: SeedReading


def run_spread(values: Sequence[float]) -> SeedVariance | None:
    """An arm's seed variance from its runs' values on the same images (each run's value is its row mean
    of the arm's seeds x images table, so this is that table's MS_seed/n), on k - 1 df; None under two
    values or where one is not finite."""
    xs = [float(v) for v in values]
    if len(xs) < 2 or not all(math.isfinite(x) for x in xs):
        return None
    mean = sum(xs) / len(xs)
    return SeedVariance(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1), len(xs) - 1)


def pooled_arms(arms: Sequence[SeedVariance]) -> SeedVariance | None:
    """One arm's estimates from several earlier grids pooled on the sum of their df; None with none."""
    df = sum(a.df for a in arms)
    return SeedVariance(sum(a.df * a.value for a in arms) / df, df) if df > 0 else None


def difference_of(a: SeedVariance | None, b: SeedVariance | None) -> SeedVariance | None:
    """A paired difference's seed variance from each arm's (independent seeds): their sum, on
    Satterthwaite's df. None unless both arms have one."""
    if a is None or b is None:
        return None
    total = a.value + b.value
    spread = a.value**2 / a.df + b.value**2 / b.df
    return SeedVariance(total, total * total / spread if spread > 0 else math.inf)


def seed_reading(own: SeedVariance | None, earlier: SeedVariance | None, check: float = CHECK) -> SeedReading:
    """The comparison's seed variance: its own pooled with the earlier grids' on the sum of their df,
    unless its own exceeds the earlier one's upper F bound at `check` (then its own alone)."""
    from scipy.stats import f  # lazily: the API imports this module and must start fast

    if earlier is None or not earlier.df > 0:
        if own is None:
            raise ValueError("one seed and no earlier grid of both arms: no seed variance to read")
        return SeedReading(own, own, None, False, "its own seeds only: no earlier grid of both arms")
    if own is None:
        return SeedReading(earlier, None, earlier, True, f"one seed: the earlier grids' on {earlier.df:.3g} df")
    bound = float(f.ppf(1 - check, own.df, earlier.df if math.isfinite(earlier.df) else 1e9))
    if earlier.value > 0 and own.value > bound * earlier.value or earlier.value <= 0 < own.value:
        ratio = own.value / earlier.value if earlier.value > 0 else math.inf
        return SeedReading(own, own, earlier, False, f"its own seeds only: they spread {ratio:.3g}x the earlier grids'")
    df = own.df + earlier.df
    value = (own.df * own.value + earlier.df * earlier.value) / df
    return SeedReading(SeedVariance(value, df), own, earlier, True, f"pooled with the earlier grids' on {df:.3g} df")


def crossed_parts(seed: float, image: float, rest: float, k: int, n: int) -> tuple[SeedVariance, SeedVariance]:
    """A crossed k x n table's per-observation components (reports/crossed.py) as borrowed_reading's inputs:
    its own seed part, MS_seed/n (seed + rest/n), on k - 1 df, and the images' and the rest's part of the
    mean's variance (image/n + rest/(k n)) on n - 1 df."""
    return SeedVariance(seed + rest / n, k - 1), SeedVariance(image / n + rest / (k * n), n - 1)


def borrowed_reading(own: SeedVariance | None, images: SeedVariance, k: int, earlier: SeedVariance | None,
                     check: float = CHECK, df_quantile: float = DF_QUANTILE) -> BorrowedReading:  # fmt: skip
    """The grand mean difference's SE and df: `own` the table's MS_seed/n (None with one seed), `images`
    the images' and the rest's part of the mean's variance (already over n) on its df, k the seeds.
    The df is Satterthwaite's with the seed term at its upper confidence bound (df_quantile; 0: as
    estimated), as sequential.decision_df does and for its reason; the SE is not changed."""
    from scipy.special import chdtri  # lazily: the API imports this module and must start fast

    if k < 1 or not (images.value >= 0 and math.isfinite(images.value)):
        raise ValueError(f"k must be >= 1 and the images' part finite and >= 0, got k={k}, {images}")
    seeds = seed_reading(own, earlier, check)
    seed_term, seed_df = seeds.variance.value / k, seeds.variance.df
    var = seed_term + images.value
    if df_quantile > 0 and math.isfinite(seed_df):
        seed_term *= seed_df / float(chdtri(seed_df, 1 - df_quantile))
    terms = [(seed_term, seed_df), (images.value, images.df)]
    total = sum(t for t, _ in terms)
    spread = sum(t * t / df for t, df in terms if df > 0 and math.isfinite(df))
    return BorrowedReading(se=math.sqrt(var), df=total * total / spread if spread > 0 else math.inf, seeds=seeds)
