"""decide.margin on the distribution metrics: CMMD and DINO-MMD may be decided (their per-sample MMD values pair
across arms and enter the crossed interval); FD-DINOv2 and FID are refused with why; a comparison whose metric
came from a stand-in extractor is never called better or worse."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from orchestrator.grids.deciding import DecideSpec
from orchestrator.results.deciding.decider import judge_comparison
from orchestrator.results.reports.costs import RunCost
from orchestrator.results.reports.crossed import crossed_interval
from orchestrator.results.reports.effects import noise_budget
from orchestrator.results.reports.model import Effect
from orchestrator.results.reports.stats import t_quantile
from tests.kit.settings import AUTH


@pytest.mark.parametrize(("metric", "why"), [("fd_dinov2", "no per-sample contributions"), ("fid", "descriptive")])
def test_a_margin_on_a_metric_without_per_sample_values_is_a_422_saying_why(
    client: TestClient, metric: str, why: str
) -> None:
    body = {"name": "fd", "arms": ["A", "B"], "decide": {"margin": {metric: 0.0}}}
    resp = client.post("/api/grids", json=body, headers=AUTH)
    assert resp.status_code == 422, resp.text
    (error,) = resp.json()["detail"]
    assert error["loc"] == ["body", "decide", "margin"], error
    assert f"decide.margin names {metric!r}" in error["msg"] and why in error["msg"] and "cmmd" in error["msg"]


def test_cmmd_and_dino_mmd_may_be_decided() -> None:
    assert set(DecideSpec(margin={"cmmd": 0.05, "dino_mmd": 0.0}).margin) == {"cmmd", "dino_mmd"}


def _cmmd_effect(standin: bool) -> Effect:
    """B against A on CMMD, 3 seeds x 64 samples, B clearly worse (+0.5 on a per-sample SD of 0.1)."""
    rng = np.random.default_rng(3)
    table = 0.5 + rng.normal(0, 0.02, (3, 1)) + rng.normal(0, 0.1, (3, 64))
    crossed = crossed_interval(table.tolist(), t_quantile)
    assert crossed is not None
    c = crossed.components
    budget = noise_budget(c, c.df, [RunCost(hours=1.0, eval_minutes=None, n=c.n, on_gpu=True)] * 2 * c.k)
    return Effect(arm="B", metric="cmmd", against="control", other_arm="A", step=100, diff=crossed.mean,
                  low=crossed.low, high=crossed.high, k=c.k, seed_sd=None, eval_se=None, noise="", interval="crossed",
                  se=crossed.se, df=c.df, n=c.n, budget=budget, reading="distinguishable across seeds", standin=standin,
                  per_seed=[])  # fmt: skip


def test_a_standin_extractors_comparison_is_never_called_better_or_worse() -> None:
    decide = DecideSpec(margin={"cmmd": 0.0}, max_seeds=3)
    real = judge_comparison(_cmmd_effect(False), decide, 1, 64, at_seeds=True, at_images=True, previous=None)
    assert real.decision == "worse"  # the same numbers from a real extractor are decided
    standin = judge_comparison(_cmmd_effect(True), decide, 1, 64, at_seeds=False, at_images=False, previous=None)
    assert (standin.decision, standin.action) == ("undecided", None)
    assert "stand-in" in standin.reason
