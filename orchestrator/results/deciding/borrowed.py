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

Two refusals guard what a check at one seed cannot (there is no own spread to test the borrowed one
against): a variance whose records came from a node the controller does not trust arrives `refused`
(results/deciding/borrowing.py), and one below SPREAD_FLOOR times the comparison's own images' part of the mean's
variance (its own SE squared, on one seed) is refused at the look. Seeds that agree that closely did not
vary (a trainer that ignores its seed) or were said to agree by whoever wrote the records; read on one seed,
either calls a null comparison from its images alone. A refused variance leaves the comparison its own
seeds (on one seed: no interval, one more seed), and the look's reason says why.

The reading, for arm a against arm b on k paired seeds and n images (the report's crossed table): the
difference of the grand means has variance S/k + I, where S is the seed variance of a paired difference
and I the images' and the rest's part of the mean's variance. S is estimated by the table's MS_seed/n (the
per-seed mean differences' spread, on k - 1 df), by the earlier grids', or by both pooled on the sum of
their df. The earlier grids' S is the spread of their paired differences (`paired_spread`) where they ran
both arms at matched training seeds: seed s of every arm shares its initialisation and data order, so the
arms' seed effects are correlated and largely cancel in the difference (measured on a GPU, tiny size:
per-seed differences with SD 0.0012 where the arms' own variances summed give 0.0154, 13x wider, and a
comparison the fixed grid called worse closed as futile). Only where the seeds were not matched is it
the arms' own variances summed (`difference_of`, on Satterthwaite's df), which is right for independent
seeds. Satterthwaite's df over S/k and I. Pure: no service.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

DF_QUANTILE = 0.1  # the seed term's upper bound the df is read at (borrowed_reading)
CHECK = 0.1  # the check's level: the comparison's own seed variance above the borrowed one's 90% F bound
# The least borrowed seed variance of a paired difference that counts, as a share of the comparison's own
# images' part (se^2 on one seed): a seed SD under 3% of that SE. Honest seeds sit above it: about 0.5 on the
# measured headline (seed 0.001, image 0.011, rest 0.0018; 64 images), where an earlier grid on 3 seeds of
# each arm falls below it by chance about once in 150,000 looks (on 2 seeds, 1 in 540; then: one more seed);
# 0.007 on tiny CPU runs of 4 images (tests/.../test_borrowing_grid.py); forged or seed-blind records read
# 1e-14 (issue 57).
SPREAD_FLOOR = 1e-3


class RefusedBorrow(ValueError):
    """One seed and a borrowed seed variance refused: no seed variance to read; the message says why."""


@dataclass(frozen=True)
class SeedVariance:
    """A seed variance estimate on `df` degrees of freedom (a chi-square's, or Satterthwaite's)."""

    value: float
    df: float
    grids: tuple[int, ...] = ()  # the earlier grids it was measured in (none: hand-made, or a comparison's own)
    refused: str | None = None  # why it may not be read (records from a node not trusted), or None
    # A difference's: True where measured on paired differences at matched seeds (paired_spread), False
    # where summed from each arm's own spread (difference_of: seeds not matched).
    paired: bool = False


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
    """One arm's estimates from several earlier grids pooled on the sum of their df, naming every grid; the
    refused ones left out (all refused: one refusal saying each grid's reason); None with none."""
    kept = [a for a in arms if a.refused is None]
    df = sum(a.df for a in kept)
    grids = tuple(dict.fromkeys(g for a in kept for g in a.grids))
    if df > 0:
        return SeedVariance(sum(a.df * a.value for a in kept) / df, df, grids, paired=all(a.paired for a in kept))
    reasons = [a.refused for a in arms if a.refused is not None]
    return SeedVariance(0.0, 0.0, refused="; ".join(dict.fromkeys(reasons))) if reasons else None


def paired_spread(a: dict[str, float], b: dict[str, float]) -> SeedVariance | None:
    """A difference's seed variance from two arms' runs keyed by their training seed: the spread of a - b
    over the seeds both ran (matched: the same initialisation and data order), on pairs - 1 df; None under
    two matched seeds or where a matched value is not finite."""
    matched = [s for s in a if s in b]
    spread = run_spread([a[s] - b[s] for s in matched])
    return SeedVariance(spread.value, spread.df, paired=True) if spread is not None else None


def difference_of(a: SeedVariance | None, b: SeedVariance | None) -> SeedVariance | None:
    """A paired difference's seed variance from each arm's, for seeds that were not matched (independent
    seed effects): their sum, on Satterthwaite's df, from both arms' grids. None unless both arms have one;
    refused where either is. Where the arms' seeds were matched, paired_spread is the one to read: this sum
    overstates a difference whose arms share their seeds' initialisation and data order."""
    if a is None or b is None:
        return None
    grids = tuple(dict.fromkeys((*a.grids, *b.grids)))
    if a.refused is not None or b.refused is not None:
        return SeedVariance(0.0, 0.0, grids, "; ".join(r for r in (a.refused, b.refused) if r is not None))
    total = a.value + b.value
    spread = a.value**2 / a.df + b.value**2 / b.df
    return SeedVariance(total, total * total / spread if spread > 0 else math.inf, grids)


def floor_refusal(earlier: SeedVariance, images: SeedVariance, floor: float = SPREAD_FLOOR) -> str | None:
    """Why a borrowed seed variance may not stand for the comparison's seeds: refused with its records, or
    below `floor` times the comparison's own images' part of the mean's variance; None where it may."""
    if earlier.refused is not None:
        return earlier.refused
    if floor > 0 and not earlier.value >= floor * images.value:
        return (f"the earlier grids' seed variance {earlier.value:.3g} is below {floor:g}x this comparison's own "
                f"SE^2 from its images ({images.value:.3g}): seeds that agree that closely did not vary")
    return None


def _from_grids(earlier: SeedVariance) -> str:
    if not earlier.grids:
        return "the earlier grids'"
    return f"the earlier grids' (grid{'s' if len(earlier.grids) > 1 else ''} {', '.join(map(str, earlier.grids))})"


def _kind(earlier: SeedVariance) -> str:
    """What the earlier grids' seed variance measured, for the look's reason."""
    return ("their paired differences at matched seeds" if earlier.paired
            else "the two arms' spreads summed (seeds not matched)")  # fmt: skip


def seed_reading(own: SeedVariance | None, earlier: SeedVariance | None, check: float = CHECK,
                 refusal: str | None = None) -> SeedReading:  # fmt: skip
    """The comparison's seed variance: its own pooled with the earlier grids' on the sum of their df,
    unless its own exceeds the earlier one's upper F bound at `check` (then its own alone). `refusal`
    (floor_refusal's): the earlier one is not read; on one seed that raises RefusedBorrow."""
    from scipy.stats import f  # lazily: the API imports this module and must start fast

    refusal = refusal if refusal is not None else (earlier.refused if earlier is not None else None)
    if refusal is not None:
        if own is None:
            raise RefusedBorrow(f"one seed and no seed variance to borrow: {refusal}")
        return SeedReading(own, own, earlier, False, f"its own seeds only: {refusal}")
    if earlier is None or not earlier.df > 0:
        if own is None:
            raise ValueError("one seed and no earlier grid of both arms: no seed variance to read")
        return SeedReading(own, own, None, False, "its own seeds only: no earlier grid of both arms")
    if own is None:
        note = f"one seed: {_from_grids(earlier)} on {earlier.df:.3g} df, {_kind(earlier)}"
        return SeedReading(earlier, None, earlier, True, note)
    bound = float(f.ppf(1 - check, own.df, earlier.df if math.isfinite(earlier.df) else 1e9))
    if earlier.value > 0 and own.value > bound * earlier.value or earlier.value <= 0 < own.value:
        ratio = own.value / earlier.value if earlier.value > 0 else math.inf
        note = f"its own seeds only: they spread {ratio:.3g}x {_from_grids(earlier)}, {_kind(earlier)}"
        return SeedReading(own, own, earlier, False, note)
    df = own.df + earlier.df
    value = (own.df * own.value + earlier.df * earlier.value) / df
    note = f"pooled with {_from_grids(earlier)} on {df:.3g} df, {_kind(earlier)}"
    return SeedReading(SeedVariance(value, df), own, earlier, True, note)


def crossed_parts(seed: float, image: float, rest: float, k: int, n: int) -> tuple[SeedVariance, SeedVariance]:
    """A crossed k x n table's per-observation components (reports/crossed.py) as borrowed_reading's inputs:
    its own seed part, MS_seed/n (seed + rest/n), on k - 1 df, and the images' and the rest's part of the
    mean's variance (image/n + rest/(k n)) on n - 1 df."""
    return SeedVariance(seed + rest / n, k - 1), SeedVariance(image / n + rest / (k * n), n - 1)


def borrowed_reading(own: SeedVariance | None, images: SeedVariance, k: int, earlier: SeedVariance | None,
                     check: float = CHECK, df_quantile: float = DF_QUANTILE,
                     floor: float = 0.0) -> BorrowedReading:  # fmt: skip
    """The grand mean difference's SE and df: `own` the table's MS_seed/n (None with one seed), `images`
    the images' and the rest's part of the mean's variance (already over n) on its df, k the seeds.
    The df is Satterthwaite's with the seed term at its upper confidence bound (df_quantile; 0: as
    estimated), as sequential.decision_df does and for its reason; the SE is not changed. `floor`: the
    least share of `images` a borrowed variance must reach (floor_refusal; the decider's SPREAD_FLOOR, 0:
    none). A refused one on one seed raises RefusedBorrow."""
    if k < 1 or not (images.value >= 0 and math.isfinite(images.value)):
        raise ValueError(f"k must be >= 1 and the images' part finite and >= 0, got k={k}, {images}")
    refusal = floor_refusal(earlier, images, floor) if earlier is not None else None
    seeds = seed_reading(own, earlier, check, refusal)
    se, df = seed_se_df(seeds.variance, images, k, df_quantile)
    return BorrowedReading(se=se, df=df, seeds=seeds)


def seed_se_df(seeds: SeedVariance, images: SeedVariance, k: int, df_quantile: float) -> tuple[float, float]:
    """The grand mean difference's SE and df from its seed part (a paired difference's seed variance on its
    df) over k seeds and its images' part: Satterthwaite's df with the seed term at its upper confidence
    bound (df_quantile; 0: as estimated); the SE is not changed."""
    from scipy.special import chdtri  # lazily: the API imports this module and must start fast

    seed_term, seed_df = seeds.value / k, seeds.df
    var = seed_term + images.value
    if df_quantile > 0 and math.isfinite(seed_df):
        seed_term *= seed_df / float(chdtri(seed_df, 1 - df_quantile))
    terms = [(seed_term, seed_df), (images.value, images.df)]
    total = sum(t for t, _ in terms)
    spread = sum(t * t / df for t, df in terms if df > 0 and math.isfinite(df))
    return math.sqrt(var), total * total / spread if spread > 0 else math.inf
