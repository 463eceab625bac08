"""A look's nominal level on Student's t (J&T 11.5, the "significance level" approach): the normal boundary's
level where the df are many, and where they are few the level sequential t tests on the look's seeds spend
(`seed_limit_levels`, set by simulation), so a deciding grid spends the alpha it states (issue 62). Pure:
numpy and scipy. sequential.py `decide` reads them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from orchestrator.results.deciding.spending import Spending, boundaries, spent, upper_tail

OVERLAP_DF = 8.0  # nominal_level: below this many df a look's level is the alpha its fraction adds (Bonferroni)


def nominal_level(ts: Sequence[float], alpha: float, spending: Spending, df: float | None,
                  few_df: float | None = None) -> float:  # fmt: skip
    """The two-sided nominal level of the last look of `ts` (usable fractions, _fractions_for): on the normal
    scale (df None) the boundary's own (2 P(Z >= c_j)), which counts on the looks' overlap (Z_j and Z_i
    correlated as sqrt(t_i/t_j)); on Student's t with df, moved toward `few_df`, the level for looks whose
    t rests on a few seeds, as the df fall, wholly so at OVERLAP_DF or fewer. Why: t statistics whose SEs
    rest on a few seeds overlap much less than their Z's (an early crossing comes from an SE small by chance,
    not from a large mean the later looks share), so the normal boundary's level, read off t at every look
    (J&T 11.5), called 6.5% to 7.3% of null comparisons where seeds dominate. `few_df`: the level the
    sequential t tests of the look's seeds spend exactly (seed_limit_levels); None: the alpha the look's
    fraction adds, spent(t_j) - spent(t_j-1), which holds alpha whatever the overlap (Bonferroni) but
    spends only about half of it where seeds dominate (issue 62)."""
    c = boundaries(ts, alpha, spending)[-1]
    level = 2 * upper_tail(c) if math.isfinite(c) else 0.0
    if df is None:
        return level
    if few_df is None:
        few_df = spent(ts[-1], alpha, spending) - (spent(ts[-2], alpha, spending) if len(ts) > 1 else 0.0)
    weight = max(0.0, 1.0 - OVERLAP_DF / df)
    return few_df + (level - few_df) * weight


SEED_LIMIT_DRAWS = 100_000  # null draws seed_limit_levels calibrates on (its levels vary by about 1% of alpha)
SEED_LIMIT_LEAST = 50  # a look whose added alpha is fewer draws than this keeps the Bonferroni level


@lru_cache(maxsize=1024)
def seed_limit_levels(seeds: tuple[int, ...], max_seeds: int, last: bool, alpha: float,
                      spending: Spending) -> tuple[float, ...]:  # fmt: skip
    """Each look's two-sided nominal level where seeds dominate: there the crossed mean's t at a look on k
    seeds is the one-sample t of the first k per-seed values (k - 1 df), and the looks' t statistics share
    those seeds. The levels are set by simulation under the null (SEED_LIMIT_DRAWS draws, a fixed RNG seed:
    the same levels at every call) so that the first crossing falls at look j with exactly the alpha its
    fraction k_j / max_seeds adds (the last at 1 where `last`): the sequential t tests' own boundaries, where
    the Bonferroni levels (the alpha each look adds, read off t) ignore that the looks share their seeds
    and spend under 4.3% of a 5% alpha at 2, 3, 4, 5, 6 and 8 seeds (tests; issue 62: "spend the alpha you
    state"). A look that adds too little alpha to calibrate keeps the Bonferroni level."""
    from scipy.special import stdtr  # lazily: the API imports this module and must start fast

    rng = np.random.default_rng(62)
    x = rng.standard_normal((SEED_LIMIT_DRAWS, max(seeds)))
    sums, squares = np.cumsum(x, axis=1), np.cumsum(x * x, axis=1)
    alive = np.ones(SEED_LIMIT_DRAWS, dtype=bool)
    levels: list[float] = []
    before = 0.0
    for j, k in enumerate(seeds):
        t = 1.0 if last and j == len(seeds) - 1 else min(1.0, k / max_seeds)
        added = max(0.0, spent(t, alpha, spending) - before)
        before += added
        mean = sums[:, k - 1] / k
        sd = np.sqrt(np.maximum(squares[:, k - 1] - k * mean * mean, 0.0) / (k - 1))
        stat = np.abs(mean) / np.maximum(sd / math.sqrt(k), 1e-300)
        wanted = round(added * SEED_LIMIT_DRAWS)
        if wanted < SEED_LIMIT_LEAST:  # too little to calibrate: the Bonferroni level
            levels.append(added)
            if added > 0:
                alive &= stat < t_upper_quantile(added / 2, k - 1)
            continue
        still = np.sort(stat[alive])[::-1]
        c = float(still[wanted - 1]) if wanted <= still.size else 0.0
        levels.append(float(2 * stdtr(k - 1, -c)))
        alive &= stat < c
    return tuple(levels)


def t_upper_quantile(p: float, df: float) -> float:
    """x with P(T >= x) = p for Student's t on df degrees of freedom (inf where p is 0: a look that spends
    nothing never crosses)."""
    from scipy.special import stdtrit  # lazily: the API imports this module and must start fast

    if not p > 0:
        return math.inf
    return float(stdtrit(df, 1 - p)) if p > 1e-15 else float(-stdtrit(df, p))
