"""The dashboard's paired difference against the control arm: per-sample pairs when the worker stored
them, else the two arms' SEs combined (labelled), else none."""

from __future__ import annotations

import math

import pytest

from orchestrator.dashboard.data import paired_difference
from orchestrator.db.models import Metric
from orchestrator.runs.ingest import metric_values


def _checkpoint(step: int, samples: list[float] | None, se: float | None = 0.02) -> Metric:
    record = {"step": step, "recon_lpips": sum(samples) / len(samples) if samples else 0.5, "recon_lpips_se": se}
    if samples is not None:
        record["recon_lpips_samples"] = samples  # as evaluate() reports them
    return Metric(step=step, **metric_values(record))


def test_per_sample_values_give_a_paired_se() -> None:
    control = [_checkpoint(10, [0.50, 0.60, 0.70, 0.80])]
    arm = [_checkpoint(10, [0.49, 0.58, 0.69, 0.78])]  # better on every sample, by about the same amount
    p = paired_difference(arm, control, "recon_lpips")
    d = [-0.01, -0.02, -0.01, -0.02]
    mean = sum(d) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 3)
    assert p["se_method"] == "paired" and p["step"] == [10]
    assert p["diff"] == [pytest.approx(mean)] and p["se"] == [pytest.approx(sd / 2)]
    assert p["se"][0] < math.sqrt(2 * 0.02**2) / 5  # far tighter than treating the arms as independent


def test_without_samples_the_se_is_the_independent_bound_or_none() -> None:
    independent = paired_difference([_checkpoint(10, None)], [_checkpoint(10, None)], "recon_lpips")
    assert independent["se_method"] == "independent" and independent["se"] == [pytest.approx(math.sqrt(2) * 0.02)]
    none = paired_difference([_checkpoint(10, None, se=None)], [_checkpoint(10, None, se=None)], "recon_lpips")
    assert none["se_method"] == "none" and none["se"] == [None]
