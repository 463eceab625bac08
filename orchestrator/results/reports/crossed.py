"""An effect across training seeds and evaluation images at once: the k x n table of paired differences
(seed s of the arm against seed s of its comparator, image i) read as a two-way crossed random-effects
design, its variance components, the variance of the grand mean and a Satterthwaite t-interval, and what
more seeds or more images would buy (the noise budget). Pure maths; effects.py reads it.

Why crossed: every seed is evaluated on the same held-out images with the same per-image noise, so what
those images happen to favour is common to all seeds and cancels out of the seed-to-seed spread. A
t-interval over the k per-seed means covers the training seeds and not the draw of images; the images
stand for the researcher's images in general, so their noise belongs in the interval.

With d[s][i] = mu + a_s + b_i + e_si (seed, image, rest), the two-way ANOVA mean squares have
E[MS_seed] = rest + n*seed, E[MS_image] = rest + k*image, E[MS_rest] = rest, and the grand mean's variance is
seed/k + image/n + rest/(k*n). A negative component estimate is taken as zero, never as a discount, so
the variance is never below what the seeds alone (MS_seed/(k*n)) or the images alone (MS_image/(k*n))
show: it equals the seeds-only one when the image component is zero and the images-only one when the seed
component is zero. Degrees of freedom by Satterthwaite over the mean squares kept. Coverage is simulated
in bench/interval_coverage.py (docs/benchmarks.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Components:
    """The variance components of one k x n table of differences (per observation, not of the mean)."""

    k: int  # seeds
    n: int  # images
    seed: float  # between-seed variance (training noise), >= 0
    image: float  # between-image variance (which images were drawn), >= 0
    rest: float  # seed x image interaction and evaluation noise
    df: float  # Satterthwaite degrees of freedom of the grand mean's variance

    def variance(self, k: int | None = None, n: int | None = None) -> float:
        """The grand mean's variance with `k` seeds and `n` images (default: as measured)."""
        k, n = k or self.k, n or self.n
        return self.seed / k + self.image / n + self.rest / (k * n)

    def shares(self) -> tuple[float, float, float]:
        """(seeds, images, rest): each one's part of the grand mean's variance (sums to 1; zeros if none)."""
        total = self.variance()
        if total <= 0:
            return 0.0, 0.0, 0.0
        return self.seed / self.k / total, self.image / self.n / total, self.rest / (self.k * self.n) / total


@dataclass(frozen=True)
class CrossedInterval:
    mean: float
    se: float
    low: float
    high: float
    components: Components


def _satterthwaite(terms: Sequence[tuple[float, float, int]]) -> float:
    """df of sum(c * MS) from (coefficient, mean square, its df); inf where the sum is exact (all zero)."""
    total = sum(c * ms for c, ms, _ in terms)
    spread = sum(c * ms * c * ms / df for c, ms, df in terms if df > 0)
    return total * total / spread if 0 < spread < math.inf else math.inf


def components(table: Sequence[Sequence[float]]) -> Components | None:
    """The variance components of a k x n table (rows: seeds, columns: images); None unless k >= 2, n >= 2
    and every row has n finite values."""
    k = len(table)
    n = len(table[0]) if k else 0
    finite = all(isinstance(x, int | float) and math.isfinite(x) for row in table for x in row)
    if k < 2 or n < 2 or any(len(row) != n for row in table) or not finite:
        return None
    grand = sum(map(sum, table)) / (k * n)
    rows = [sum(row) / n for row in table]
    cols = [sum(row[i] for row in table) / k for i in range(n)]
    sq = lambda x: x * x  # noqa: E731 - inf past a float's range, never OverflowError as ** raises
    ms_seed = n * sum(sq(r - grand) for r in rows) / (k - 1)
    ms_image = k * sum(sq(c - grand) for c in cols) / (n - 1)
    ss_rest = sum(sq(x - rows[s] - cols[i] + grand) for s, row in enumerate(table) for i, x in enumerate(row))
    ms_rest = ss_rest / ((k - 1) * (n - 1))
    seed, image = max(ms_seed - ms_rest, 0.0) / n, max(ms_image - ms_rest, 0.0) / k
    # The grand mean's variance as a sum of the mean squares kept (a clipped component drops its MS and
    # its -MS_rest), over k*n: the terms Satterthwaite's df is taken on.
    terms = [(1.0, ms_seed, k - 1)] if seed > 0 else []
    terms += [(1.0, ms_image, n - 1)] if image > 0 else []
    terms.append((1.0 - len(terms), ms_rest, (k - 1) * (n - 1)))
    terms = [(c / (k * n), ms, df) for c, ms, df in terms if c != 0]
    return Components(k=k, n=n, seed=seed, image=image, rest=ms_rest, df=_satterthwaite(terms))


def crossed_interval(
    table: Sequence[Sequence[float]], quantile: Callable[[float | None], float]
) -> CrossedInterval | None:
    """The grand mean of `table` with its 95% interval: `quantile(df)` (stats.t_quantile) times the SE."""
    comp = components(table)
    if comp is None:
        return None
    mean = sum(map(sum, table)) / (comp.k * comp.n)
    se = math.sqrt(comp.variance())
    half = quantile(comp.df if math.isfinite(comp.df) else None) * se
    return CrossedInterval(mean, se, mean - half, mean + half, comp)


def budget_words(comp: Components) -> str:
    """e.g. "seeds 8% · images 90% · rest 2%" (rest: the seed-by-image interaction and evaluation noise)."""
    seed, image, rest = comp.shares()
    return f"seeds {seed:.0%} · images {image:.0%} · rest {rest:.0%}"
