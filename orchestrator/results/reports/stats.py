"""Differences between two arms' checkpoints, their standard errors and 95% intervals: pure maths over
stored metric rows (the dashboard's paired curves and the report's comparisons both use it).

Pairing: the evaluation seeds its noise per sample (model/evaluate.py), so sample i of every arm is
generated from the same noise and target; per-sample differences then have SE sd(d)/sqrt(n), far
tighter than the two arms' SEs combined. Without stored per-sample values the arms are treated as
independent: SE sqrt(se_a^2 + se_b^2), an upper bound when samples are positively correlated.

An MMD (CMMD, DINO-MMD) is measured against reference images shared by both arms: where both rows carry their
per-reference values (model/distribution_pass.py), the spread of their difference over the reference images,
/ R, is added to the paired variance (and, across seeds, to the crossed one: crossed.py `reference_part`).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

from model.flow_headline import HEADLINE, headline_fields, weighted_row
from model.spec import REFERENCE_SUFFIX
from orchestrator.db.models import METRIC_FIELDS, Metric
from orchestrator.numbers import finite_or_none, is_finite
from orchestrator.results.record_lists import stored_list
from orchestrator.results.reports.crossed import (
    Components,
    ReferencePart,
    crossed_interval,
    reference_part,
    unpaired_interval,
)
from worker.protocol import NONFINITE_TEXT

# Quality metrics with stored standard errors, and which way is better (text_manip_delta: a larger
# response to an edited caption is better; the detector's secondary policy says the same).
# val_flow_loss: velocity space for every arm, so x-prediction and AsymFlow arms compare on it.
QUALITY = ("recon_lpips", "text_lpips", "text_manip_delta", "val_flow_loss")
# Sample quality against held-out images (model/distribution_pass.py): the MMDs pair per sample; FD has SEs only.
DISTRIBUTION = ("cmmd", "dino_mmd", "fd_dinov2")
LOWER_IS_BETTER = {"recon_lpips": True, "text_lpips": True, "text_manip_delta": False, "val_flow_loss": True,
                   HEADLINE: True, **dict.fromkeys(DISTRIBUTION, True)}  # fmt: skip
Pairing = Literal["paired", "independent", "none"]


def value_of(m: Metric, name: str) -> float | None:
    """A record's number `name`: its column, or (the flow headline, a command arm's own metric, their `_se`
    or `_n`) the number in `extra`; None where missing or not a number (the text of a non-finite value reads
    as NaN). A record from before the flow headline gets it from its stored grid."""
    extra = m.extra or {}
    if name.startswith(HEADLINE) and HEADLINE not in extra and isinstance(extra.get("val_flow_loss_grid"), list):
        extra = headline_fields(extra["val_flow_loss_grid"])
    value = getattr(m, name) if name in METRIC_FIELDS else extra.get(name)
    if isinstance(value, str) and value in NONFINITE_TEXT:
        return float(value)
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def per_sample(m: Metric, metric: str) -> list[float] | None:
    """Per-sample values, if the worker stored them in `extra` (enables a truly paired SE): a list of
    finite numbers, else None (a diverged sample, "nan" as stored, leaves the arms unpaired)."""
    values = stored_list(m.extra, f"{metric}_samples")
    return values if values and all(is_finite(x) for x in values) else None


def per_reference(m: Metric, metric: str) -> list[float] | None:
    """An MMD's per-reference-image values, if the worker stored them: a list of 3 or more finite numbers, else
    None (a record from before them: its effects leave the reference's noise out)."""
    values = stored_list(m.extra, f"{metric}{REFERENCE_SUFFIX}")
    return values if values and len(values) >= 3 and all(is_finite(x) for x in values) else None


def t_quantile(df: float | None) -> float:
    """Two-sided 95% quantile of Student's t with `df` degrees of freedom (normal when df is None)."""
    from scipy.stats import norm, t  # lazily: the API imports this module and must start fast

    return float(norm.ppf(0.975) if df is None or df <= 0 else t.ppf(0.975, df))


@dataclass(frozen=True)
class Difference:
    """a - b at one checkpoint step: the difference, its SE and 95% interval, and how they were got."""

    diff: float
    se: float | None
    low: float | None
    high: float | None
    pairing: Pairing  # paired (per-sample values) | independent (SEs combined, or none stored)
    n: int | None  # pairs (paired) or the smaller arm's n (independent), when known
    missing: str | None = None  # why there is no interval, where there is none
    samples: tuple[float, ...] | None = None  # the per-image differences (paired): a row of the crossed table
    reference: tuple[float, ...] | None = None  # an MMD's per-reference-image differences (paired), where stored


def difference(a: Metric, b: Metric, metric: str) -> Difference | None:
    """a - b on `metric` (None when either value is missing or non-finite), with a 95% interval: t with
    n-1 df for paired samples, Welch-Satterthwaite df for independent SEs with known n, else normal."""
    a_val, b_val = value_of(a, metric), value_of(b, metric)
    if not is_finite(a_val) or not is_finite(b_val):
        return None
    diff = a_val - b_val
    sa, sb = per_sample(a, metric), per_sample(b, metric)
    if sa and sb and len(sa) == len(sb) > 1:
        ra, rb = per_reference(a, metric), per_reference(b, metric)
        refs = [x - y for x, y in zip(ra, rb, strict=True)] if ra and rb and len(ra) == len(rb) else None
        return _paired([x - y for x, y in zip(sa, sb, strict=True)], diff, refs)
    se_a, se_b = value_of(a, f"{metric}_se"), value_of(b, f"{metric}_se")
    n_a, n_b = value_of(a, f"{metric}_n"), value_of(b, f"{metric}_n")
    n_a, n_b = (int(n_a) if n_a else None), (int(n_b) if n_b else None)
    n = min(n_a, n_b) if n_a and n_b else None
    if se_a is None or se_b is None:
        return Difference(diff, None, None, None, "independent", n, "no per-sample values or standard errors stored")
    if not is_finite(se_a) or not is_finite(se_b) or se_a < 0 or se_b < 0:
        return Difference(diff, None, None, None, "independent", n, "a standard error is not a finite number >= 0")
    se = math.hypot(se_a, se_b)  # no overflow or underflow of the squares
    df = None
    if n_a and n_b and n_a > 1 and n_b > 1 and se > 0:
        # Welch-Satterthwaite on the SEs scaled to at most 1: SEs of 1e-100 underflow to a 0/0 otherwise
        ra, rb = se_a / max(se_a, se_b), se_b / max(se_a, se_b)
        df = (ra**2 + rb**2) ** 2 / (ra**4 / (n_a - 1) + rb**4 / (n_b - 1))
    return _interval(Difference(diff, se, None, None, "independent", n), df)


def _interval(d: Difference, df: float | None = None) -> Difference:
    """`d` with its 95% interval from its SE, or none (and why) where the interval is not finite."""
    half = t_quantile(df) * d.se if d.se is not None and is_finite(d.se) else math.inf
    if not is_finite(d.diff) or not is_finite(half) or not is_finite(d.diff + half) or not is_finite(d.diff - half):
        return Difference(d.diff, None, None, None, d.pairing, d.n, "the interval is not finite (values too large)",
                          d.samples, d.reference)  # fmt: skip
    return Difference(d.diff, d.se, d.diff - half, d.diff + half, d.pairing, d.n, samples=d.samples,
                      reference=d.reference)


def paired_difference(arm: list[Metric], control: list[Metric], metric: str) -> dict[str, Any]:
    """arm - control at each checkpoint both have, with the SE of the difference and how it was got
    (the dashboard's curves): paired, independent (SEs combined), or none (no SE stored)."""
    by_step = {m.step: m for m in control}
    steps, diffs, ses, methods = [], [], [], []
    for m in arm:
        c = by_step.get(m.step)
        d = difference(m, c, metric) if c is not None else None
        if d is None:
            continue
        steps.append(m.step)
        diffs.append(d.diff)
        ses.append(d.se)
        methods.append(d.pairing if d.se is not None else "none")
    method = Counter(methods).most_common(1)[0][0] if methods else "none"
    return {"step": steps, "diff": diffs, "se": [finite_or_none(s) for s in ses], "se_method": method}


# The flow-loss headline no single timestep owns (model/flow_headline.py): per image, the loss averaged over
# the timesteps with fixed inverse-variance weights measured once. The same number ranks the runs, picks
# the best checkpoint, is what the detector judges on the flow loss, and its paired difference is the
# effects table's headline. Old records without it get it from their stored (image x time) grid.
WEIGHTED_FLOW = HEADLINE


def flow_grid(m: Metric) -> list[list[float]] | None:
    """The stored (image x timestep) val_flow_loss grid (`extra["val_flow_loss_grid"]`), if any, rectangular
    and finite (a diverged cell, "nan" as stored, leaves the grid out)."""
    grid = stored_list(m.extra, "val_flow_loss_grid")
    if not grid or not grid[0] or not all(is_finite(x) for row in grid for x in row):
        return None
    return grid


def _paired(d: list[float], value: float, reference: list[float] | None = None) -> Difference:
    """`value` with the t-interval of the mean of the per-sample differences `d` (len >= 2); with an MMD's
    per-reference differences, their part of the variance added (Satterthwaite df over the two)."""
    mean = sum(d) / len(d)
    var = sum((x - mean) * (x - mean) for x in d) / (len(d) - 1) / len(d)  # inf, not OverflowError
    ref = reference_part([reference]) if reference is not None else None
    df: float = len(d) - 1
    if ref is not None and ref.variance > 0 and var < math.inf:
        total = var + ref.variance
        df = total * total / (var * var / (len(d) - 1) + ref.variance * ref.variance / (ref.count - 1))
        var = total
    refs = tuple(reference) if ref is not None else None
    return _interval(Difference(value, math.sqrt(var), None, None, "paired", len(d), samples=tuple(d),
                                reference=refs), df)  # fmt: skip


def per_image(m: Metric, metric: str) -> list[float] | None:
    """One run's value on each held-out image (a row of its seeds x images table): the flow headline's from
    its stored grid, any other metric's stored samples; None where not stored or not finite."""
    if metric != WEIGHTED_FLOW:
        return per_sample(m, metric)
    rows = [weighted_row(r) for r in flow_grid(m) or []]
    return rows if len(rows) > 1 and all(is_finite(x) for x in rows) else None  # type: ignore[misc]


def _grid_pair(a: Metric, b: Metric) -> tuple[list[list[float]], list[list[float]]] | None:
    """Both runs' stored grids where they pair cell by cell (same shape, at least two images), else None."""
    ga, gb = flow_grid(a), flow_grid(b)
    if ga is None or gb is None or len(ga) != len(gb) or len(ga[0]) != len(gb[0]) or len(ga) < 2:
        return None
    return ga, gb


def weighted_flow_difference(a: Metric, b: Metric) -> Difference | None:
    """a - b on the flow headline, paired over the images (each image's loss weighted over the timesteps by
    the fixed weights). None without both grids of one shape, 8 timesteps wide."""
    grids = _grid_pair(a, b)
    if grids is None:
        return None
    rows = [(weighted_row(ra), weighted_row(rb)) for ra, rb in zip(*grids, strict=True)]
    if any(x is None or y is None for x, y in rows):
        return None
    d = [x - y for x, y in rows]  # type: ignore[operator]
    return _paired(d, sum(d) / len(d))


def timestep_differences(a: Metric, b: Metric) -> list[Difference] | None:
    """a - b at each timestep of the stored grids, paired over the images (the report's appendix)."""
    grids = _grid_pair(a, b)
    if grids is None:
        return None
    ga, gb = grids
    out = []
    for t in range(len(ga[0])):
        d = [ra[t] - rb[t] for ra, rb in zip(ga, gb, strict=True)]
        out.append(_paired(d, sum(d) / len(d)))
    return out


Interval = Literal["crossed", "independent", "seeds only", "one seed"]


@dataclass(frozen=True)
class SeedEffect:
    """One comparison across training seeds: the mean of the per-seed paired differences (seed s of the
    arm against seed s of the comparator), with the 95% interval `interval` names:
    - crossed: every seed paired image by image on the same images (per-image differences of one length
      n on every seed): the seeds x images interval of crossed.py, covering both;
    - independent: no per-image values to cross: the seeds' spread plus one seed's evaluation SE, on
      Satterthwaite df (conservative: the rest is counted twice);
    - seeds only: no evaluation SE either: a t-interval on k - 1 df that leaves the images' noise out;
    - one seed: that seed's own evaluation interval; training noise is not measured."""

    diff: float
    low: float | None
    high: float | None
    k: int  # seeds with a difference on both sides
    seed_sd: float | None  # SD of the per-seed differences (k >= 2)
    eval_se: float | None  # the per-seed evaluation SEs' mean: what one seed's interval covers
    interval: Interval = "one seed"
    se: float | None = None  # of diff, by `interval`
    df: float | None = None
    n: int | None = None  # images (crossed), else the per-seed n where one
    components: Components | None = None  # crossed only


def _crossed_rows(per_seed: list[Difference]) -> list[tuple[float, ...]] | None:
    rows = [d.samples for d in per_seed]
    if any(r is None for r in rows) or len({len(r) for r in rows}) != 1:  # type: ignore[arg-type]
        return None
    return rows  # type: ignore[return-value]


def _reference_of(per_seed: list[Difference]) -> ReferencePart | None:
    """The reference's part of the crossed variance where every seed's difference carries its per-reference
    differences, of one length; else None."""
    refs = [d.reference for d in per_seed]
    return reference_part(refs) if all(r is not None for r in refs) else None  # type: ignore[arg-type]


def across_arms(arm: list[list[float]], other: list[list[float]],
                references: tuple[list[list[float]], ...] | None = None) -> SeedEffect | None:  # fmt: skip
    """The arm's mean less the other's where they ran different seeds, each over its own seeds (rows) and the
    same images (columns): the unpaired crossed interval (crossed.py), so no seed of either is dropped. None
    unless each has two or more seeds of one length n >= 2. `k` is the fewer seeds; seed_sd and eval_se
    are the paired reading's (per-seed differences), left to the caller. `references`: each side's per-reference
    values by seed (an MMD), for the reference's part of the variance."""
    ref = reference_part(*references) if references is not None else None
    crossed = unpaired_interval(arm, other, t_quantile, ref)
    if crossed is None or not is_finite(crossed.low) or not is_finite(crossed.high):
        return None
    c = crossed.components
    return SeedEffect(crossed.mean, crossed.low, crossed.high, c.k, None, None, "crossed", crossed.se,
                      c.df if math.isfinite(c.df) else None, c.n, c)  # fmt: skip


def across_seeds(per_seed: list[Difference]) -> SeedEffect | None:
    if not per_seed:
        return None
    ses = [d.se for d in per_seed if is_finite(d.se)]
    eval_se = sum(ses) / len(ses) if ses else None
    k = len(per_seed)
    ns = {d.n for d in per_seed if d.n}
    n = ns.pop() if len(ns) == 1 else None
    if k == 1:
        d = per_seed[0]
        return SeedEffect(d.diff, d.low, d.high, 1, None, eval_se, "one seed", d.se, None, d.n)
    diffs = [d.diff for d in per_seed]
    mean = sum(diffs) / k
    seed_sd = math.sqrt(sum((x - mean) * (x - mean) for x in diffs) / (k - 1))  # inf, not OverflowError
    rows = _crossed_rows(per_seed)
    crossed = crossed_interval(rows, t_quantile, _reference_of(per_seed)) if rows is not None else None
    if crossed is not None and is_finite(crossed.low) and is_finite(crossed.high):  # else past a float's range
        c = crossed.components
        return SeedEffect(mean, crossed.low, crossed.high, k, seed_sd, eval_se, "crossed", crossed.se,
                          c.df if math.isfinite(c.df) else None, c.n, c)  # fmt: skip
    seeds_var = seed_sd * seed_sd / k
    if len(ses) == k:  # every seed's evaluation SE: add the images' noise the seeds' spread leaves out
        eval_var = sum(s * s for s in ses) / k  # type: ignore[operator]
        var = seeds_var + eval_var
        n_eval = min((d.n for d in per_seed if d.n), default=0)
        spread = seeds_var * seeds_var / (k - 1) + (eval_var * eval_var / (n_eval - 1) if n_eval > 1 else math.inf)
        df = var * var / spread if 0 < spread < math.inf else None  # normal where an evaluation's n is unknown
        interval: Interval = "independent"
    else:
        var, df, interval = seeds_var, float(k - 1), "seeds only"
    se = math.sqrt(var)
    if not is_finite(se) or (se == 0 and interval == "independent"):
        return SeedEffect(mean, None, None, k, seed_sd, eval_se, interval, None, None, n)
    half = t_quantile(df) * se
    if not is_finite(mean - half) or not is_finite(mean + half):
        return SeedEffect(mean, None, None, k, seed_sd, eval_se, interval, None, None, n)
    return SeedEffect(mean, mean - half, mean + half, k, seed_sd, eval_se, interval, se, df, n)
