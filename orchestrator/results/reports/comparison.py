"""One comparison of two runs' checkpoints on one metric, with its sentence and verdict (the report's rows and the
effects table's per-seed inputs). A distribution metric names its extractor; a stand-in extractor's
comparison is "stand-in extractor: descriptive", never better or worse."""

from __future__ import annotations

from typing import Any

from orchestrator.db.models import Metric
from orchestrator.numbers import finite_or_none, number
from orchestrator.results.reports.effects import metric_words
from orchestrator.results.reports.model import STANDIN_VERDICT, Comparison
from orchestrator.results.reports.stats import (
    LOWER_IS_BETTER,
    WEIGHTED_FLOW,
    difference,
    value_of,
    weighted_flow_difference,
)
from orchestrator.runs.checkpoint import EXTRACTOR_SUFFIX, STANDIN_WORD

DIGITS = ".3f"  # how a report writes a metric value or difference


def compare(arm: str, m: Metric, other_arm: str, o: Metric | None, metric: str, against: str, at: str,
            lower_is_better: bool | None = None) -> Comparison:  # fmt: skip
    """One comparison with its sentence, e.g. "C vs B: recon LPIPS 0.070 lower (0.058 to 0.082), better".
    `lower_is_better`: the metric's direction where it is not one of ablate's (a command arm's own)."""
    if lower_is_better is None:
        lower_is_better = LOWER_IS_BETTER.get(metric, True)
    label = f"{arm} vs {other_arm} ({against}, {at} step {m.step})"
    words = metric_words(metric)
    base: dict[str, Any] = {"metric": metric, "against": against, "other_arm": other_arm, "at": at, "step": m.step}
    if o is None:
        return Comparison(**base, words=f"{label}: {other_arm} has no checkpoint at step {m.step}")
    # the flow headline: paired image by image from the stored grids (older records hold no per-image list)
    d = weighted_flow_difference(m, o) if metric == WEIGHTED_FLOW else difference(m, o, metric)
    values = {"value": finite_or_none(value_of(m, metric)), "other_value": finite_or_none(value_of(o, metric))}
    if d is None:
        return Comparison(**base, **values, words=f"{label}: {words} not measured on both")
    extractor = extractor_of(m, o, metric)
    if extractor is not None:
        base["extractor"] = extractor
        words = f"{words} ({extractor})"
    direction = "lower" if d.diff < 0 else "higher" if d.diff > 0 else "equal"
    text = f"{label}: {words} {number(abs(d.diff), DIGITS)} {direction}"
    if d.low is None or d.high is None:
        verdict = "no interval"
        why = d.missing or f"no per-sample values{'' if d.pairing == 'paired' else ' or standard errors'} stored"
        text += f" ({d.pairing}; no interval: {why})"
    else:
        lo, hi = sorted((abs(d.low), abs(d.high))) if d.low * d.high > 0 else (d.low, d.high)
        n = f", n={d.n}" if d.n else ""
        text += f" ({number(lo, DIGITS)} to {number(hi, DIGITS)}, 95%, {d.pairing}{n})"
        if extractor is not None and STANDIN_WORD in extractor:
            verdict = STANDIN_VERDICT  # random features: the numbers, never a judgement
        elif d.low <= 0 <= d.high:
            verdict = "no clear difference"
        else:
            verdict = "better" if (d.diff < 0) == lower_is_better else "worse"
        text += f", {verdict}"
    return Comparison(
        **base, **values, diff=d.diff, se=d.se, low=d.low, high=d.high, pairing=d.pairing, n=d.n,
        verdict=verdict, words=text, samples=list(d.samples) if d.samples is not None else None,
        reference=list(d.reference) if d.reference is not None else None,
    )  # fmt: skip


def extractor_of(m: Metric, o: Metric, metric: str) -> str | None:
    """A distribution metric's extractor label: the stand-in's where either side's is one, else the arm's."""
    labels = [x for row in (m, o) if isinstance(x := (row.extra or {}).get(f"{metric}{EXTRACTOR_SUFFIX}"), str)]
    return next((x for x in labels if STANDIN_WORD in x), labels[0] if labels else None)
