"""Differences with 95% intervals and the sentences that state them."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from orchestrator.db.models import Metric
from orchestrator.results.reports.build import compare
from orchestrator.results.reports.stats import difference
from orchestrator.runs.ingest import metric_values


def _checkpoint(step: int, samples: list[float] | None, se: float | None = None, n: int | None = None) -> Metric:
    record = {"step": step, "recon_lpips": sum(samples) / len(samples) if samples else 0.5, "recon_lpips_se": se,
              "recon_lpips_n": n}  # fmt: skip
    if samples is not None:
        record["recon_lpips_samples"] = samples
    return Metric(step=step, **metric_values(record))


def test_paired_interval_is_t_with_n_minus_1_df() -> None:
    b = _checkpoint(5000, [0.90, 1.00, 1.10, 1.05, 0.95])
    c = _checkpoint(5000, [0.83, 0.92, 1.04, 0.98, 0.89])
    d = difference(c, b, "recon_lpips")
    diffs = [-0.07, -0.08, -0.06, -0.07, -0.06]
    mean = sum(diffs) / 5
    se = math.sqrt(sum((x - mean) ** 2 for x in diffs) / 4) / math.sqrt(5)
    assert d is not None and d.pairing == "paired" and d.n == 5
    assert d.diff == pytest.approx(mean) and d.se == pytest.approx(se)
    assert d.low == pytest.approx(mean - stats.t.ppf(0.975, 4) * se)
    words = compare("C", c, "B", b, "recon_lpips", "parent", "final").words
    assert words == (f"C vs B (parent, final step 5000): recon LPIPS 0.068 lower "
                     f"({-d.high:.3f} to {-d.low:.3f}, 95%, paired, n=5), better")  # fmt: skip


def test_independent_interval_uses_welch_and_a_straddling_interval_is_no_clear_difference() -> None:
    a, b = _checkpoint(100, None, se=0.03, n=25), _checkpoint(100, None, se=0.04, n=25)
    d = difference(a, b, "recon_lpips")
    se = math.sqrt(0.03**2 + 0.04**2)
    df = se**4 / (0.03**4 / 24 + 0.04**4 / 24)
    assert d is not None and d.pairing == "independent" and d.se == pytest.approx(se)
    assert d.high - d.diff == pytest.approx(stats.t.ppf(0.975, df) * se)
    assert compare("A", a, "B", b, "recon_lpips", "control", "best").verdict == "no clear difference"


def test_a_worse_metric_and_a_higher_is_better_metric() -> None:
    worse = compare("B", _checkpoint(10, [0.6, 0.7, 0.8]), "A", _checkpoint(10, [0.5, 0.61, 0.69]),
                    "recon_lpips", "parent", "final")  # fmt: skip
    assert worse.verdict == "worse" and "higher" in worse.words
    delta = "text_manip_delta"
    m = Metric(step=10, **metric_values({"step": 10, delta: 0.4, f"{delta}_samples": [0.4, 0.5, 0.3]}))
    o = Metric(step=10, **metric_values({"step": 10, delta: 0.2, f"{delta}_samples": [0.2, 0.3, 0.1]}))
    assert compare("X", m, "Y", o, "text_manip_delta", "control", "best").verdict == "better"  # larger delta is better
    missing = compare("X", m, "Y", None, "recon_lpips", "control", "final")
    assert missing.verdict is None and "Y has no checkpoint at step 10" in missing.words
