"""The deciding grid's chooser never prices a seed at zero because two or three seeds happened to agree:
decider.components_of reads the seed component the noise budget prices a seed at (crossed.py
Components.seed_priced), not the clipped point estimate a 1-df mean square gives."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.results.deciding.decider import components_of
from orchestrator.results.deciding.sequential import Costs, choose_action, mean_variance
from orchestrator.results.reports.costs import RunCost
from orchestrator.results.reports.crossed import ReferencePart, crossed_interval
from orchestrator.results.reports.effects import noise_budget
from orchestrator.results.reports.model import Effect
from orchestrator.results.reports.stats import t_quantile


def effect_of(table: list[list[float]], reference: ReferencePart | None = None) -> Effect:
    crossed = crossed_interval(table, t_quantile, reference)
    assert crossed is not None
    c = crossed.components
    budget = noise_budget(c, c.df, [RunCost(hours=1.0, eval_minutes=None, n=c.n, on_gpu=True)] * 2 * c.k)
    return Effect(arm="B", metric="val_flow_ivw", against="control", other_arm="A", step=100, diff=crossed.mean,
                  low=crossed.low, high=crossed.high, k=c.k, seed_sd=None, eval_se=None, noise="", interval="crossed",
                  se=crossed.se, df=c.df, n=c.n, budget=budget, reading="within noise", per_seed=[])  # fmt: skip


def test_two_seeds_that_agree_still_price_a_seed() -> None:
    """Two seeds whose means came out closer than the rest predicts: the clipped seed share is 0%, yet the
    seed component is about half the variance in truth (the mixed profile); the chooser reads a positive
    one, so one more seed is worth something to it."""
    rng = np.random.default_rng(7)
    n = 64
    table = rng.normal(0, 0.011, (1, n)) + rng.normal(0, 0.004, (2, n))
    table -= table.mean(axis=1, keepdims=True) - table.mean()  # the two seeds' means agree exactly
    e = effect_of(table.tolist())
    assert e.budget is not None and e.budget.seeds == 0
    v = components_of(e)
    assert v.seed > 0
    assert "2 seeds: not measured" in e.budget.words
    # images are at the budget: the seed's variance removed per GPU-hour is above zero
    act = choose_action(v, 2, n, Costs(seed_a=1.0, seed_b=1.0, image=1e-4), max_seeds=8, max_images=n)
    assert act.kind == "seed" and act.per_hour > 0


def test_where_the_seeds_have_df_the_chooser_reads_about_the_measured_seed() -> None:
    rng = np.random.default_rng(8)
    table = rng.normal(0, 0.006, (8, 1)) + rng.normal(0, 0.0015, (1, 64)) + rng.normal(0, 0.006, (8, 64))
    e = effect_of(table.tolist())
    assert e.budget is not None and e.se is not None
    measured = e.budget.seeds * e.se**2 * e.k
    assert measured < components_of(e).seed < 1.5 * measured


def test_pricing_two_seeds_costs_little_over_the_truth() -> None:
    """bench/chooser_cost.py's seed-dominated cell with short runs (an evaluation costs about a training
    run), small: the chooser reading the look's own table spends within 5% of the GPU-hours the true
    components would, where main's clipped seed share, which often priced the second seed's worth at zero
    and bought images, spent about 12% more."""
    from bench.chooser_cost import cell

    got = cell("seed-dominated", "short runs", "near", 100, 0)
    true = got["true"][0]
    assert got["chooser"][0] <= 1.05 * true
    assert got["clipped"][0] > 1.05 * true


def test_the_chooser_prices_a_seed_at_the_share_the_budget_prints() -> None:
    """Issue 62 item 7: the seed component the chooser reads back from the budget is the one the words print
    (crossed.py Components.seed_priced), reference part or not, at 2 seeds (the "priced at") and at 5 (the
    seeds' share); the seed action's variance after is priced with it."""
    rng = np.random.default_rng(9)
    n = 64
    for k, ref in ((2, None), (5, None), (3, ReferencePart(2e-6, 40))):
        table = rng.normal(0, 0.002, (k, 1)) + rng.normal(0, 0.011, (1, n)) + rng.normal(0, 0.004, (k, n))
        crossed = crossed_interval(table.tolist(), t_quantile, ref)
        assert crossed is not None
        c = crossed.components
        e = effect_of(table.tolist(), ref)
        assert e.budget is not None and e.budget.seeds_priced == c.seed_share_with(c.seed_priced)
        assert f"{e.budget.seeds_priced:.0%}" in e.budget.words.split(" · ")[0]
        v = components_of(e)
        assert v.seed == pytest.approx(c.seed_priced, rel=1e-9)
        others = c.variance() - c.seed / k  # the mean's variance but the seeds' part
        assert v.seed / k / (v.seed / k + others) == pytest.approx(e.budget.seeds_priced, rel=1e-9)
        act = choose_action(v, k, n, Costs(seed_a=1.0, seed_b=1.0, image=1e-4), max_seeds=8, max_images=n)
        assert act.kind == "seed" and act.variance == pytest.approx(mean_variance(v, k + 1, n), rel=1e-12)
