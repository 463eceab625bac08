"""The seeds x images crossed interval computed by hand, in numpy, from the textbook formulas (a second
derivation the report's pure-Python one is checked against): two-way ANOVA mean squares, components with
negatives at zero, the grand mean's variance, and the df: the fewer of Satterthwaite's over the mean squares
kept and Satterthwaite's with the seed component at its 75% upper confidence bound (always counted, on the seed
mean square's df; the rest on its own), then t(0.975, df)."""

from __future__ import annotations

import numpy as np
from scipy import stats


def _satterthwaite(terms: list[tuple[float, float]]) -> float:
    """df of sum(c) from (c = coefficient * mean square, its df)."""
    total = sum(c for c, _ in terms)
    return total**2 / sum(c**2 / f for c, f in terms if c != 0)


def crossed_by_hand(table: list[list[float]]) -> dict[str, float]:
    d = np.asarray(table, dtype=np.float64)
    k, n = d.shape
    grand = d.mean()
    ms_seed = n * ((d.mean(axis=1) - grand) ** 2).sum() / (k - 1)
    ms_image = k * ((d.mean(axis=0) - grand) ** 2).sum() / (n - 1)
    resid = d - d.mean(axis=1, keepdims=True) - d.mean(axis=0, keepdims=True) + grand
    ms_rest = (resid**2).sum() / ((k - 1) * (n - 1))
    seed = max(ms_seed - ms_rest, 0.0) / n
    image = max(ms_image - ms_rest, 0.0) / k
    var = seed / k + image / n + ms_rest / (k * n)
    # var * k * n as a combination of mean squares: each kept component brings its MS and a -MS_rest.
    kept = [(ms_seed, k - 1)] * int(seed > 0) + [(ms_image, n - 1)] * int(image > 0)
    kept += [((1 - len(kept)) * ms_rest, (k - 1) * (n - 1))]
    bound = ms_seed * (k - 1) / stats.chi2.ppf(0.25, k - 1)
    at_bound = [(max(bound - ms_rest, 0.0), k - 1)]
    at_bound += [(ms_image, n - 1)] if image > 0 else [(ms_rest, (k - 1) * (n - 1))]
    df = min(_satterthwaite(kept), _satterthwaite(at_bound))
    half = stats.t.ppf(0.975, df) * np.sqrt(var)
    return {"mean": grand, "se": float(np.sqrt(var)), "df": float(df), "low": grand - half, "high": grand + half,
            "seed": seed, "image": image, "rest": ms_rest}
