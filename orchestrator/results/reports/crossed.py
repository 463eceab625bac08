"""An effect across training seeds and evaluation images at once, read as a crossed random-effects design:
its variance components, the variance of the grand mean and a Satterthwaite t-interval, and what more seeds
or more images would buy (the noise budget). Pure maths; stats.py and effects.py read it.

Why crossed: every seed is evaluated on the same held-out images with the same per-image noise, so what
those images happen to favour is common to all seeds and cancels out of the seed-to-seed spread. A
t-interval over the k per-seed means covers the training seeds and not the draw of images; the images
stand for the researcher's images in general, so their noise belongs in the interval.

Two readings of one model:
- paired (`components`): seed s of the arm against seed s of its comparator, the k x n table of paired
  differences d[s][i] = mu + a_s + b_i + e_si (seed, image, rest). Two-way ANOVA mean squares:
  E[MS_seed] = rest + n*seed, E[MS_image] = rest + k*image, E[MS_rest] = rest.
- unpaired (`unpaired_components`): where the two arms ran different numbers of seeds (a deciding grid adds
  seeds to the control for one comparison), the difference of the two arms' means, each over its own seeds
  and the same n images, so no seed is dropped. Each arm's seeds x images table gives its own seed and rest
  mean squares; the images' part is the spread over the images of the difference of the two arms' image
  means, E = image + rest_a/k_a + rest_b/k_b. Paired seeds that share something (the data order) make this
  reading conservative, never narrower than the truth.
Either way the grand mean's variance is sum(seed_j/k_j) + image/n + sum(rest_j/(k_j*n)) over the sides j
(one side: the paired table). A negative component is taken as zero, never as a discount, so the variance
is never below what the seeds alone or the images alone show.

Degrees of freedom: the fewer of Satterthwaite's over the mean squares kept and Satterthwaite's with each
seed component at its upper confidence bound ((k-1) MS / chi2_{k-1}(SEED_DF_BOUND), less the rest's mean
square) on the seed mean square's k - 1 df, kept even where it was clipped. Why: with 2 to 4 seeds the seed
mean square has 1 to 3 df, and a draw where it is small by chance got both a smaller SE and, by
Satterthwaite, many df; the interval then covered 88% at 2 seeds and 92.9% at 3 where one arm's seeds spread
3x the other's. Only the component is bounded: the rest's share of the seed mean square is known to its own
(k-1)(n-1) df, and bounding the whole mean square (issue 56) had counted it as uncertain as the seeds, so
where seeds were negligible and the rest large (CMMD's per-sample values, bench/distribution_sim.py) the
interval covered 97-98% at 3 seeds. The SE is not changed. Coverage is simulated in
bench/interval_coverage.py and bench/distribution_sim.py (docs/benchmarks.md).

A distribution metric's MMD has a third sampling noise: the reference images it is measured against, one draw
shared by every seed, image and arm. It cancels from the difference only near the null, and no seed or image
spread shows it, so an effect adds it as a fixed part of the grand mean's variance (`ReferencePart`: the spread
over the reference images of the per-reference values' difference, averaged over the seeds, / their count R, on
R - 1 df), the same whatever k and n. Without it, where arms differ and seeds vary little, intervals covered
93.3-93.7% at 5 and 8 seeds in bench/distribution_sim.py's large shift and 91.5% at 8 in the tests' model
(0.955-0.960 with it; docs/benchmarks.md, issue 62).

The noise budget's seed share is the one the chooser of a deciding grid prices a seed at
(`Components.seed_priced`: the seed component's median given its mean square and that it is not negative),
beside the share with the seed mean square at its 90% upper bound: "seeds 45%, up to 70%"; images and rest
are their shares beside that seed part, so the words sum to 100%. Why not the clipped point (ANOVA's MS
difference, taken as zero where negative): a ratio of a mean square on k - 1 df, it read low on average
(true 77% read 52% at 2 seeds, 63% at 3, 71% at 5). The median reads within 0.05 of the truth on average at
4 seeds, 0.04 at 5 and 0.025 at 8 over true shares 10-98%, regressing a little to the middle (low shares
read high, high ones low). No share held to 0-100% can be unbiased at both ends on a 1- or 2-df mean square
(the median read 28% for 10% and 77% for 90% at 2 seeds, 16% and 83% at 3), so under POINT_SEEDS seeds the
budget prints the bound first and names the median as the seed's price, not as a measurement: "seeds up to
91%, priced at 48% (2 seeds: not measured)". The bound holds the true share in about 90% of tables.
Simulated in bench/seed_share.py (docs/benchmarks.md, issue 62).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

SEED_DF_BOUND = 0.25  # the seed mean square's upper confidence bound the df is read at (1 - this): at the
# median the simulated coverage of a 3x arm fell to about 93% at 3 seeds; here it holds 94% or more
# (bench/interval_coverage.py)
SHARE_BOUND = 0.1  # the budget's "up to": the seed share at its mean square's one-sided 90% upper bound
POINT_SEEDS = 4  # the fewest seeds whose priced share the budget prints as the seeds' share (module docstring)


@dataclass(frozen=True)
class Components:
    """The variance components of one table of differences (per observation, not of the mean). Where the
    arms ran different seeds (`sides` of two), seed and rest are as one side of k = the fewer seeds would
    have them, so that variance(k, n) is the grand mean's and more seeds project as both arms adding some."""

    k: int  # seeds (unpaired: the fewer of the two arms')
    n: int  # images
    seed: float  # between-seed variance (training noise), >= 0
    image: float  # between-image variance (which images were drawn), >= 0
    rest: float  # seed x image interaction and evaluation noise
    df: float  # the degrees of freedom of the interval (module docstring)
    seed_high: float = 0.0  # seed with each seed mean square at its 90% upper bound: what the seeds cannot rule out
    seed_priced: float = 0.0  # the seed component's median given its mean square(s) and that it is >= 0: > 0
    sides: tuple[int, ...] = ()  # each side's seeds: (k,) paired, (arm's, comparator's) unpaired
    reference: float = 0.0  # the reference images' part of the grand mean's variance (an MMD): fixed in k and n
    references: int = 0  # the reference values it was read from (0: none, not a distribution metric's MMD)

    def variance(self, k: int | None = None, n: int | None = None) -> float:
        """The grand mean's variance with `k` seeds and `n` images (default: as measured), the reference's
        part included: more seeds or samples leave it as it is."""
        k, n = k or self.k, n or self.n
        return self.seed / k + self.image / n + self.rest / (k * n) + self.reference

    def shares(self) -> tuple[float, float, float]:
        """(seeds, images, rest): each one's part of the grand mean's variance (zeros if none); they sum to 1
        less `reference_share`."""
        total = self.variance()
        if total <= 0:
            return 0.0, 0.0, 0.0
        return self.seed / self.k / total, self.image / self.n / total, self.rest / (self.k * self.n) / total

    def reference_share(self) -> float:
        """The reference images' part of the grand mean's variance (0 where none was read)."""
        total = self.variance()
        return self.reference / total if total > 0 else 0.0

    def seed_share_with(self, seed: float) -> float:
        """The seeds' share of the grand mean's variance were the seed component `seed` (the rest as measured)."""
        return self.shares_with(seed)[0]

    def shares_with(self, seed: float) -> tuple[float, float, float]:
        """(seeds, images, rest) as `shares`, were the seed component `seed` (the others as measured)."""
        parts = (seed / self.k, self.image / self.n, self.rest / (self.k * self.n))
        total = sum(parts) + self.reference
        return (parts[0] / total, parts[1] / total, parts[2] / total) if total > 0 else (0.0, 0.0, 0.0)

    def priced_share(self) -> float:
        """The seeds' share the budget prints and the chooser prices a seed at (`seed_priced`'s)."""
        return self.seed_share_with(self.seed_priced)


@dataclass(frozen=True)
class CrossedInterval:
    mean: float
    se: float
    low: float
    high: float
    components: Components


@dataclass(frozen=True)
class ReferencePart:
    """The reference images' part of an MMD effect's variance (module docstring)."""

    variance: float  # of the grand mean: the per-reference differences' spread / their count
    count: int  # reference values (images, or groups of them past the record's bound)


def _column_means(rows: Sequence[Sequence[float]]) -> list[float] | None:
    width = len(rows[0]) if rows else 0
    finite = all(isinstance(x, int | float) and math.isfinite(x) for row in rows for x in row)
    if width < 3 or any(len(row) != width for row in rows) or not finite:
        return None
    return [sum(row[a] for row in rows) / len(rows) for a in range(width)]


def reference_part(rows: Sequence[Sequence[float]],
                   other: Sequence[Sequence[float]] | None = None) -> ReferencePart | None:  # fmt: skip
    """From per-reference values, one row per seed: paired, `rows` are the seeds' differences (arm - comparator)
    and each reference image's value is their mean over the seeds; unpaired, `rows` are the arm's own values and
    `other` the comparator's, and each image's value is the arm's mean less the comparator's. None unless every
    row has the same R >= 3 finite values."""
    means = _column_means(rows)
    if other is not None:
        theirs = _column_means(other)
        if means is None or theirs is None or len(means) != len(theirs):
            return None
        means = [x - y for x, y in zip(means, theirs, strict=True)]
    if means is None:
        return None
    r = len(means)
    mean = sum(means) / r
    return ReferencePart(sum(_sq(x - mean) for x in means) / (r - 1) / r, r)


@dataclass(frozen=True)
class _Side:
    """One arm's (or the paired differences') seeds x images table, reduced to what the model reads."""

    k: int
    ms_seed: float  # n * variance of the row means, on k - 1 df
    ms_rest: float  # the two-way residual mean square, on (k - 1)(n - 1) df
    means: list[float]  # the image (column) means
    grand: float


def _sq(x: float) -> float:
    return x * x  # inf past a float's range, never OverflowError as ** raises


def _side(table: Sequence[Sequence[float]]) -> _Side | None:
    k = len(table)
    n = len(table[0]) if k else 0
    finite = all(isinstance(x, int | float) and math.isfinite(x) for row in table for x in row)
    if k < 2 or n < 2 or any(len(row) != n for row in table) or not finite:
        return None
    grand = sum(map(sum, table)) / (k * n)
    rows = [sum(row) / n for row in table]
    cols = [sum(row[i] for row in table) / k for i in range(n)]
    ms_seed = n * sum(_sq(r - grand) for r in rows) / (k - 1)
    ss_rest = sum(_sq(x - rows[s] - cols[i] + grand) for s, row in enumerate(table) for i, x in enumerate(row))
    return _Side(k, ms_seed, ss_rest / ((k - 1) * (n - 1)), cols, grand)


def _satterthwaite(terms: Sequence[tuple[float, float, int]]) -> float:
    """df of sum(c * MS) from (coefficient, mean square, its df); inf where the sum is exact (all zero)."""
    total = sum(c * ms for c, ms, _ in terms)
    spread = sum(c * ms * c * ms / df for c, ms, df in terms if df > 0)
    return total * total / spread if 0 < spread < math.inf else math.inf


def _chi2_quantile(p: float, df: int) -> float:
    from scipy.special import chdtri  # lazily: the API imports this module and must start fast

    return float(chdtri(df, 1 - p))


def _upper_bound(ms: float, df: int, p: float) -> float:
    """The mean square's expectation at its one-sided upper confidence bound: df * MS / chi2_df(p)."""
    return ms * df / _chi2_quantile(p, df)


def _priced_seed(ms_seed: float, ms_rest: float, df: int, n: int) -> float:
    """The seed component's median given its mean square and that it is not negative: E[MS_seed] = theta
    read as df * MS_seed / X with X ~ chi2_df, X held to theta >= MS_rest, its median taken. Above zero
    wherever MS_seed is; close to (MS_seed - MS_rest)/n once the seeds have many df."""
    from scipy.special import chdtr

    if not ms_seed > 0:
        return 0.0
    most = df * ms_seed / ms_rest if ms_rest > 0 else math.inf  # theta >= MS_rest  <=>  X <= most
    x = _chi2_quantile(float(chdtr(df, most)) / 2 if math.isfinite(most) else 0.5, df)
    return max(df * ms_seed / x - ms_rest, 0.0) / n if x > 0 else 0.0


def _read(sides: Sequence[_Side], images_ms: float, n: int, ref: ReferencePart | None = None) -> Components:
    """The components from each side's seed and rest mean squares and the images' mean square `images_ms`
    (the spread over the images of the difference's image means, on n - 1 df: E = image + sum(rest_j/k_j)),
    and the reference's part where read (n times it, on R - 1 df, is one more term of the df)."""
    k = min(s.k for s in sides)
    seeds = [max(s.ms_seed - s.ms_rest, 0.0) / n for s in sides]
    image = max(images_ms - sum(s.ms_rest / s.k for s in sides), 0.0)
    # The variance times n as a sum of terms with each seed component at its bound and kept (on the seed mean
    # square's k - 1 df; the rest on its own, once, unless the images' mean square brings it): the df's terms.
    terms = [(1.0, images_ms, n - 1)] if image > 0 else []
    if ref is not None and ref.variance > 0:
        terms.append((float(n), ref.variance, ref.count - 1))
    measured = list(terms)
    for s, seed in zip(sides, seeds, strict=True):
        bound = max(_upper_bound(s.ms_seed, s.k - 1, SEED_DF_BOUND) - s.ms_rest, 0.0)  # n x the seed component's
        terms.append((1.0 / s.k, bound, s.k - 1))
        terms.append(((1 - float(image > 0)) / s.k, s.ms_rest, (s.k - 1) * (n - 1)))
        measured.append((float(seed > 0) / s.k, s.ms_seed, s.k - 1))
        measured.append(((1 - float(seed > 0) - float(image > 0)) / s.k, s.ms_rest, (s.k - 1) * (n - 1)))
    # Satterthwaite is not monotone in a term: never more df than the mean squares as measured give.
    df = min(_satterthwaite([t for t in terms if t[0] != 0]), _satterthwaite([t for t in measured if t[0] != 0]))
    high = [max(_upper_bound(s.ms_seed, s.k - 1, SHARE_BOUND) - s.ms_rest, 0.0) / n for s in sides]
    priced = [max(_priced_seed(s.ms_seed, s.ms_rest, s.k - 1, n), seed) for s, seed in zip(sides, seeds, strict=True)]

    def as_k(parts: Sequence[float]) -> float:  # per-side parts over their own k, as one side of k seeds
        return k * sum(p / s.k for p, s in zip(parts, sides, strict=True))

    return Components(k=k, n=n, seed=as_k(seeds), image=image, rest=as_k([s.ms_rest for s in sides]),
                      df=df, seed_high=as_k(high),
                      seed_priced=as_k(priced), sides=tuple(s.k for s in sides),
                      reference=ref.variance if ref is not None else 0.0,
                      references=ref.count if ref is not None else 0)  # fmt: skip


def components(table: Sequence[Sequence[float]], reference: ReferencePart | None = None) -> Components | None:
    """The variance components of a paired k x n table (rows: seeds, columns: images), with the reference's
    part where given; None unless k >= 2, n >= 2 and every row has n finite values."""
    side = _side(table)
    if side is None:
        return None
    n = len(side.means)
    ms_image = side.k * sum(_sq(c - side.grand) for c in side.means) / (n - 1)
    return _read([side], ms_image / side.k, n, reference)


def unpaired_components(arm: Sequence[Sequence[float]], other: Sequence[Sequence[float]],
                        reference: ReferencePart | None = None) -> Components | None:  # fmt: skip
    """The variance components of the difference of two arms' means, each over its own seeds (rows) and the
    same n images (columns, in the same order); None unless each arm has >= 2 seeds of n >= 2 finite values."""
    a, b = _side(arm), _side(other)
    if a is None or b is None or len(a.means) != len(b.means):
        return None
    n = len(a.means)
    diffs = [x - y for x, y in zip(a.means, b.means, strict=True)]
    mean = sum(diffs) / n
    return _read([a, b], sum(_sq(d - mean) for d in diffs) / (n - 1), n, reference)


def _interval(mean: float, comp: Components, quantile: Callable[[float | None], float]) -> CrossedInterval:
    se = math.sqrt(comp.variance())
    half = quantile(comp.df if math.isfinite(comp.df) else None) * se
    return CrossedInterval(mean, se, mean - half, mean + half, comp)


def crossed_interval(
    table: Sequence[Sequence[float]], quantile: Callable[[float | None], float], reference: ReferencePart | None = None
) -> CrossedInterval | None:
    """The grand mean of the paired `table` with its 95% interval: `quantile(df)` (stats.t_quantile) times
    the SE (an MMD's: with the reference's part, `reference_part` of its per-reference differences)."""
    comp = components(table, reference)
    if comp is None:
        return None
    return _interval(sum(map(sum, table)) / (comp.k * comp.n), comp, quantile)


def unpaired_interval(arm: Sequence[Sequence[float]], other: Sequence[Sequence[float]],
                      quantile: Callable[[float | None], float],
                      reference: ReferencePart | None = None) -> CrossedInterval | None:  # fmt: skip
    """The arm's mean less the other's, each over its own seeds and the same images, with its 95% interval."""
    comp = unpaired_components(arm, other, reference)
    if comp is None:
        return None
    mean = sum(map(sum, arm)) / (len(arm) * comp.n) - sum(map(sum, other)) / (len(other) * comp.n)
    return _interval(mean, comp, quantile)


def _measured(k: int) -> str:
    """How well k seeds measure a seed share (its mean square's df: k - 1)."""
    return {2: " (2 seeds: not measured)", 3: " (3 seeds: loosely measured)"}.get(k, "")


def budget_words(comp: Components) -> str:
    """e.g. "seeds 45%, up to 70% · images 53% · rest 2%": the seeds' share as the
    chooser prices a seed (`priced_share`) and at its mean square's 90% upper bound, images and rest beside it
    (rest: the seed-by-image interaction and evaluation noise); under POINT_SEEDS seeds the bound first, "seeds
    up to 61%, priced at 38% (3 seeds: loosely measured)"; an MMD's effect adds " · reference images 12%"."""
    seed, image, rest = comp.shares_with(comp.seed_priced)
    high = comp.seed_share_with(comp.seed_high)
    ref = f" · reference images {max(1 - seed - image - rest, 0.0):.0%}" if comp.references else ""
    if comp.k >= POINT_SEEDS:
        seeds = f"seeds {seed:.0%}, up to {high:.0%}"
    else:
        seeds = f"seeds up to {high:.0%}, priced at {seed:.0%}"
    return f"{seeds}{_measured(comp.k)} · images {image:.0%} · rest {rest:.0%}{ref}"
