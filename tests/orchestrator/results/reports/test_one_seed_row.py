"""A one-seed effect row says once that training noise is not measured (issue 64 item 6: it said so three
times; fixed on main in 1d84bef, this guards it)."""

from __future__ import annotations

from orchestrator.results.reports.effects import _rows, effect_reading, noise_words
from orchestrator.results.reports.model import Effect, SeedDiff
from orchestrator.results.reports.stats import SeedEffect


def test_a_one_seed_row_says_training_noise_is_not_measured_once() -> None:
    seed = SeedEffect(diff=-0.031, low=-0.052, high=-0.010, k=1, seed_sd=None, eval_se=0.0107, n=64)
    effect = Effect(arm="B", metric="val_flow_loss", against="parent", other_arm="A", step=400, diff=seed.diff,
                    low=seed.low, high=seed.high, k=1, seed_sd=None, eval_se=seed.eval_se, noise=noise_words(seed),
                    n=64, reading=effect_reading(1, seed.low, seed.high),
                    per_seed=[SeedDiff(seed=0, diff=seed.diff, low=seed.low, high=seed.high, n=64)])  # fmt: skip
    row = " | ".join(_rows([effect])[0])
    assert row.count("training noise") == 1, row
    assert "one seed: training noise not measured" in row and "(one training seed)" in row
