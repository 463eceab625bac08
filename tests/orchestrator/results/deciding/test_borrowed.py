"""A comparison's seed variance borrowed from earlier grids (orchestrator/results/deciding/borrowed.py) on hand-made
numbers: an arm's spread and its df, several grids pooled, a difference's Satterthwaite df, the check that
refuses a borrowed variance the comparison's own seeds disagree with, and one seed read on the earlier
grids' variance alone; and its error rate simulated with a known truth, where it holds and where it does
not (an arm that changed since the earlier grid)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import f
from scipy.stats import t as student

from orchestrator.results.deciding.borrowed import (
    CHECK,
    SeedVariance,
    borrowed_reading,
    crossed_parts,
    difference_of,
    paired_spread,
    pooled_arms,
    run_spread,
    seed_reading,
)
from orchestrator.results.deciding.borrowing import EarlierSpreads
from orchestrator.results.reports.crossed import components


def test_run_spread_is_the_runs_sample_variance_on_k_minus_one_df() -> None:
    assert run_spread([1.0, 2.0, 3.0, 4.0]) == SeedVariance(5 / 3, 3)
    assert run_spread([0.25, 0.75]) == SeedVariance(0.125, 1)
    assert run_spread([1.0]) is None  # one run: no spread
    assert run_spread([1.0, math.nan, 2.0]) is None


def test_pooled_arms_weighs_each_grid_by_its_df() -> None:
    assert pooled_arms([SeedVariance(1.0, 2), SeedVariance(4.0, 1)]) == SeedVariance(2.0, 3)
    assert pooled_arms([]) is None


def test_difference_of_two_arms_sums_them_on_satterthwaites_df() -> None:
    d = difference_of(SeedVariance(1.0, 2), SeedVariance(3.0, 4))
    assert d is not None
    assert d.value == pytest.approx(4.0)
    assert d.df == pytest.approx(16 / (1 / 2 + 9 / 4))  # (a + b)^2 / (a^2/df_a + b^2/df_b) = 5.82
    assert 4 < d.df < 6  # between the smaller arm's df and their sum
    assert difference_of(SeedVariance(1.0, 2), None) is None and difference_of(None, SeedVariance(1.0, 2)) is None


def test_matched_seeds_borrow_the_paired_differences_spread_not_the_arms_summed() -> None:
    """Issue 62's GPU runs (tiny, 100 steps, seeds 0-2 of each arm): the per-seed differences C - A are
    0.0068 / 0.0091 / 0.0084, SD 0.0012, where the arms' own variances summed give SD 0.0154 (13x)."""
    a = {"data 0": 0.6150, "data 1": 0.6224, "data 2": 0.6359}
    c = {"data 0": 0.6218, "data 1": 0.6315, "data 2": 0.6443}
    paired = paired_spread(c, a)
    assert paired is not None and paired.paired and paired.df == 2
    assert math.sqrt(paired.value) == pytest.approx(0.00118, abs=1e-5)
    summed = difference_of(run_spread(list(a.values())), run_spread(list(c.values())))
    assert summed is not None and not summed.paired
    assert math.sqrt(summed.value) == pytest.approx(0.0155, abs=1e-4)
    # Only the seeds both arms ran pair up; under two, nothing is paired.
    assert paired_spread(c, {**a, "data 3": 9.0}) == paired
    assert paired_spread(c, {"data 0": 0.6150, "data 7": 0.6224}) is None
    # The look's reason says which it read.
    images = SeedVariance(1e-6, 3)
    assert "their paired differences at matched seeds" in borrowed_reading(None, images, 1, paired).seeds.note
    assert "spreads summed (seeds not matched)" in borrowed_reading(None, images, 1, summed).seeds.note


def test_the_check_refuses_own_seeds_spreading_ten_times_the_earlier_ones() -> None:
    earlier, own = SeedVariance(1.0, 8), SeedVariance(10.0, 2)
    assert 10.0 > f.ppf(1 - CHECK, 2, 8)  # past the F bound (3.11): the borrowed variance no longer fits
    s = seed_reading(own, earlier)
    assert (s.variance, s.borrowed, s.own, s.earlier) == (own, False, own, earlier)
    assert "its own seeds only" in s.note and "10x" in s.note
    r = borrowed_reading(own, SeedVariance(0.0, 9), 3, earlier, df_quantile=0)
    assert r.se == pytest.approx(math.sqrt(10.0 / 3)) and r.df == pytest.approx(2)  # its own alone, on k - 1


def test_own_seeds_that_agree_pool_with_the_earlier_ones_on_the_summed_df() -> None:
    earlier, own = SeedVariance(1.0, 8), SeedVariance(1.2, 2)
    s = seed_reading(own, earlier)
    assert s.borrowed and s.variance.df == 10
    assert s.variance.value == pytest.approx((2 * 1.2 + 8 * 1.0) / 10)
    assert "pooled with the earlier grids' on 10 df" in s.note
    # A looser check refuses what the default pools: the check is the level of that F bound.
    wider = SeedVariance(0.5, 8)  # own 2.4x it: inside the default's F bound (3.11), past the bound at 0.4 (1.0)
    assert seed_reading(own, wider).borrowed and not seed_reading(own, wider, check=0.4).borrowed


def test_one_seed_reads_the_earlier_variance_alone() -> None:
    earlier, images = SeedVariance(2.0, 4), SeedVariance(0.5, 9)
    r = borrowed_reading(None, images, 1, earlier, df_quantile=0)
    assert r.seeds.variance == earlier and r.seeds.borrowed and r.seeds.own is None
    assert "one seed: the earlier grids' on 4 df" in r.seeds.note
    assert r.se == pytest.approx(math.sqrt(2.0 + 0.5))
    assert r.df == pytest.approx(2.5**2 / (2.0**2 / 4 + 0.5**2 / 9))  # Satterthwaite over seeds and images
    # At the default quantile the seed term counts at its upper bound for the df: fewer df, the same SE.
    bounded = borrowed_reading(None, images, 1, earlier)
    assert bounded.se == r.se and bounded.df < r.df


def test_one_seed_with_no_earlier_grid_raises() -> None:
    with pytest.raises(ValueError, match="one seed and no earlier grid"):
        seed_reading(None, None)
    with pytest.raises(ValueError, match="one seed and no earlier grid"):
        borrowed_reading(None, SeedVariance(0.5, 9), 1, None)


def test_crossed_parts_are_the_tables_seed_mean_square_and_the_rest_of_the_means_variance() -> None:
    own, images = crossed_parts(seed=2.0, image=8.0, rest=4.0, k=2, n=4)
    assert own == SeedVariance(2.0 + 4.0 / 4, 1)  # MS_seed / n = seed + rest / n, on k - 1 df
    assert images == SeedVariance(8.0 / 4 + 4.0 / (2 * 4), 3)  # image / n + rest / (k n), on n - 1 df


def null_call_rate(k: int, spread_now: float, spread_then: float, draws: int = 3000) -> float:
    """The share of null comparisons (arm a against arm b, no true difference) a single 95% reading calls,
    simulated with a known truth: the weighted headline's measured components, arm b's seed SD `spread_now`
    times a's, an earlier grid of both arms on 3 seeds in which b's was `spread_then` times a's, k seeds
    of each now on 64 images."""
    rng = np.random.default_rng(7)
    seed_sd, image_sd, rest_sd = (x / math.sqrt(2) for x in (0.001, 0.011, 0.0018))  # each arm's share
    n = 64
    calls = 0
    for _ in range(draws):
        then = {arm: run_spread(rng.normal(0, seed_sd * s, 3) + rng.normal(0, rest_sd, (3, n)).mean(axis=1))
                for arm, s in (("a", 1.0), ("b", spread_then))}  # fmt: skip
        now = {arm: rng.normal(0, seed_sd * s, (k, 1)) + rng.normal(0, image_sd, (1, n))
               + rng.normal(0, rest_sd, (k, n)) for arm, s in (("a", 1.0), ("b", spread_now))}  # fmt: skip
        d = now["a"] - now["b"]
        if k == 1:
            own, images = None, SeedVariance(float(d[0].var(ddof=1)) / n, n - 1)
        else:
            c = components(d.tolist())
            assert c is not None
            own, images = crossed_parts(c.seed, c.image, c.rest, k, n)
        r = borrowed_reading(own, images, k, difference_of(then["a"], then["b"]))
        calls += abs(float(d.mean())) / r.se > student.ppf(0.975, r.df)
    return calls / draws


@pytest.mark.parametrize("k", [1, 2])
def test_a_borrowed_reading_holds_its_error_rate_where_an_arm_spreads_3x(k: int) -> None:
    """Each arm's own earlier variance (b's 3x there too): at most alpha, by simulation (3,000 nulls:
    3.2% on one seed and 2.7% on two here; conservative by the df's bound on the seed term)."""
    assert 0.015 <= null_call_rate(k, spread_now=3.0, spread_then=3.0) <= 0.055


def test_a_borrowed_variance_from_an_arm_that_changed_undercovers_on_one_seed() -> None:
    """The limit the README states: b spread 1x in the earlier grid and 3x now, and one seed has nothing
    to check it by (12.7% of nulls called here); two seeds let the check refuse some (6.3%)."""
    one_seed = null_call_rate(1, spread_now=3.0, spread_then=1.0)
    assert one_seed > 0.08
    assert null_call_rate(2, spread_now=3.0, spread_then=1.0) < one_seed


def test_a_comparison_reads_the_paired_spread_only_where_its_own_arms_share_seeds() -> None:
    """EarlierSpreads.difference: the earlier grids' paired differences where the grid's own seed s of both
    arms trained at one training seed, else the arms' spreads summed (the rule for independent seeds)."""
    pair = SeedVariance(0.1, 2, (3,), paired=True)
    arms = {"m": {"A": SeedVariance(1.0, 2, (3,)), "C": SeedVariance(2.0, 2, (3,))}}
    matched = EarlierSpreads(arms=arms, pairs={"m": {("A", "C"): pair}}, matched=frozenset({("A", "C")}))
    assert matched.difference("m", "C", "A") == matched.difference("m", "A", "C") == pair
    unmatched = EarlierSpreads(arms=arms, pairs={"m": {("A", "C"): pair}}, matched=frozenset())
    assert unmatched.difference("m", "C", "A") == difference_of(arms["m"]["C"], arms["m"]["A"])
    assert unmatched.difference("m", "C", "B") is None
