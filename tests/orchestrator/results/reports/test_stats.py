"""Differences with 95% intervals and the sentences that state them."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from orchestrator.db.models import Metric
from orchestrator.results.reports.build import compare
from orchestrator.results.reports.stats import (
    difference,
    flow_grid,
    timestep_differences,
    weighted_flow_difference,
)
from orchestrator.runs.ingest import metric_values
from worker.protocol import jsonable


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


# -- records a diverged arm writes, and degenerate standard errors ------------------------------------------------


def _flow_checkpoint(step: int, grid: list[list[float]], se: float | None = None) -> Metric:
    """A checkpoint as the trainer writes its flow loss (model/evaluate.py flow_loss_metrics), through the
    protocol's JSON (worker/protocol.py jsonable: a NaN becomes the text "nan") and ingest."""
    per_image = [sum(row) / len(row) for row in grid]
    record = {"step": step, "val_flow_loss": 0.5, "val_flow_loss_se": se, "val_flow_loss_n": len(grid),
              "val_flow_loss_samples": per_image, "val_flow_loss_grid": grid,
              "val_flow_loss_by_t": [sum(col) / len(col) for col in zip(*grid, strict=True)],
              "val_flow_loss_t": [0.25, 0.75]}  # fmt: skip
    return Metric(step=step, **metric_values(jsonable(record)))


def test_a_diverged_arms_nan_samples_and_grid_as_stored_leave_the_pair_unpaired_not_a_type_error() -> None:
    """Finding 10, deterministically: the record of the README test's diverging arm. Its NaN cells travel as
    "nan" and are stored so; flow_grid called math.isfinite("nan"): TypeError, and the report was a 500."""
    diverged = _flow_checkpoint(100, [[0.4, math.nan], [0.5, 0.6], [0.3, 0.5]], se=0.01)
    honest = _flow_checkpoint(100, [[0.4, 0.5], [0.5, 0.6], [0.3, 0.4]], se=0.01)
    assert diverged.extra["val_flow_loss_grid"][0] == [0.4, "nan"]  # the text form, as stored
    assert flow_grid(diverged) is None and flow_grid(honest) is not None
    assert weighted_flow_difference(diverged, honest) is None and timestep_differences(honest, diverged) is None
    d = difference(diverged, honest, "val_flow_loss")  # per-sample "nan": the SEs, independent
    assert d is not None and d.pairing == "independent" and d.low is not None
    words = compare("C", diverged, "A", honest, "val_flow_ivw", "control", "final").words
    assert words.endswith("not measured on both")


@pytest.mark.parametrize("se", [0.0, 1e-100, 1e-300])
def test_degenerate_standard_errors_give_an_interval_or_say_why_not(se: float) -> None:
    """Two arms' SEs of 1e-100 made Welch's df 0/0 (the fourth powers underflow): ZeroDivisionError."""
    a, b = _checkpoint(100, None, se=se, n=25), _checkpoint(100, None, se=se, n=25)
    d = difference(a, b, "recon_lpips")
    assert d is not None and d.low is not None and d.low <= d.diff <= d.high
    if se > 0:  # equal SEs and n: Welch's df is n_a + n_b - 2, whatever their scale
        assert (d.high - d.diff) / d.se == pytest.approx(stats.t.ppf(0.975, 48))


def test_an_interval_past_what_a_float_holds_is_missing_and_says_why() -> None:
    # stored before ingest bounded a list's values (now past 1e30 they are stored as "inf")
    big = Metric(step=1, val_flow_loss=1e300, extra={"val_flow_loss_samples": [1e300, -1e300, 1e300]})
    small = Metric(step=1, val_flow_loss=0.0, extra={"val_flow_loss_samples": [0.0, 0.0, 0.0]})
    d = difference(big, small, "val_flow_loss")  # (x - mean)**2 raised OverflowError
    assert d is not None and d.low is None and d.missing == "the interval is not finite (values too large)"
    words = compare("B", big, "A", small, "val_flow_loss", "control", "final").words
    assert words.endswith("(paired; no interval: the interval is not finite (values too large))")
    stored_inf = _checkpoint(100, None, se=0.01, n=25)
    stored_inf.recon_lpips_se = math.inf
    d = difference(stored_inf, _checkpoint(100, None, se=0.01, n=25), "recon_lpips")
    assert d is not None and d.missing == "a standard error is not a finite number >= 0"
