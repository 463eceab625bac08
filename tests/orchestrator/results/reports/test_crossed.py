"""The effects table's crossed seeds x images interval (crossed.py through stats.across_seeds): a hand
computation on a fixed table, its two limits (no seed noise: the images-only interval; no image noise:
the seeds-only one), never narrower than either, and the noise budget's shares and options."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from orchestrator.results.reports.costs import RunCost
from orchestrator.results.reports.crossed import components
from orchestrator.results.reports.effects import noise_budget
from orchestrator.results.reports.stats import Difference, across_seeds
from tests.kit.crossed_by_hand import crossed_by_hand

# Three seeds x six images of paired differences: image 2 favours the arm on every seed, seed 1 a little.
TABLE = [
    [0.010, 0.004, -0.012, 0.008, 0.015, 0.003],
    [0.013, 0.006, -0.008, 0.011, 0.016, 0.007],
    [0.009, 0.001, -0.013, 0.009, 0.012, 0.002],
]


def _per_seed(table: list[list[float]]) -> list[Difference]:
    return [Difference(sum(r) / len(r), None, None, None, "paired", len(r), samples=tuple(r)) for r in table]


def test_the_crossed_interval_matches_a_hand_computation() -> None:
    effect = across_seeds(_per_seed(TABLE))
    hand = crossed_by_hand(TABLE)
    assert effect is not None and effect.interval == "crossed" and (effect.k, effect.n) == (3, 6)
    assert effect.diff == pytest.approx(hand["mean"]) and effect.se == pytest.approx(hand["se"])
    assert effect.df == pytest.approx(hand["df"])
    assert (effect.low, effect.high) == (pytest.approx(hand["low"]), pytest.approx(hand["high"]))
    c = effect.components
    assert c is not None and (c.seed, c.image, c.rest) == pytest.approx((hand["seed"], hand["image"], hand["rest"]))
    # The images' noise, common to every seed, is in it: far wider than the interval over the 3 seed means.
    means = [sum(r) / 6 for r in TABLE]
    seed_only = stats.t.ppf(0.975, 2) * stats.tstd(means) / math.sqrt(3)
    assert effect.high - effect.low > 2 * seed_only  # type: ignore[operator]


def test_no_seed_noise_gives_the_images_only_variance() -> None:
    """Every seed with the same mean over the images (their rows differ image by image): the seed component
    is zero, not negative, and the interval is the paired t-interval over the images of the seed-averaged
    differences, on n - 1 df: a seed mean square of zero bounds the seed component at zero too (crossed.py)."""
    row = TABLE[0]
    wobble = [0.002, -0.002, 0.001, -0.001, 0.0, 0.0]
    table = [row, [x + w for x, w in zip(row, wobble, strict=True)], [x - w for x, w in zip(row, wobble, strict=True)]]
    effect = across_seeds(_per_seed(table))
    assert effect is not None and effect.components is not None and effect.components.seed == 0
    cols = [sum(r[i] for r in table) / 3 for i in range(6)]
    assert effect.se == pytest.approx(stats.tstd(cols) / math.sqrt(6))
    assert effect.df == pytest.approx(5)
    half = stats.t.ppf(0.975, effect.df) * stats.tstd(cols) / math.sqrt(6)
    assert (effect.low, effect.high) == (pytest.approx(sum(cols) / 6 - half), pytest.approx(sum(cols) / 6 + half))


def test_no_image_noise_gives_the_seeds_only_interval() -> None:
    """Each seed's differences equal over the images: the image component is zero and the interval is the
    t-interval of the per-seed means on k - 1 df."""
    table = [[m] * 6 for m in (0.004, 0.009, 0.006)]
    effect = across_seeds(_per_seed(table))
    assert effect is not None and effect.components is not None and effect.components.image == 0
    half = stats.t.ppf(0.975, 2) * stats.tstd([0.004, 0.009, 0.006]) / math.sqrt(3)
    assert effect.df == pytest.approx(2)
    assert (effect.low, effect.high) == (pytest.approx(0.019 / 3 - half), pytest.approx(0.019 / 3 + half))


def test_a_negative_component_is_zero_not_a_discount() -> None:
    """The grand mean's variance is never below what the seeds alone or the images alone show."""
    table = [[0.01, -0.02, 0.03, 0.0], [0.02, 0.01, -0.01, 0.02], [-0.01, 0.0, 0.02, 0.01]]
    c = components(table)
    assert c is not None
    k, n = 3, 4
    means_s = [sum(r) / n for r in table]
    means_i = [sum(r[i] for r in table) / k for i in range(n)]
    seeds_alone = stats.tvar(means_s) / k
    images_alone = stats.tvar(means_i) / n
    assert c.variance() >= max(seeds_alone, images_alone) - 1e-15


def test_unequal_image_counts_fall_back_and_say_so() -> None:
    per_seed = _per_seed(TABLE)
    per_seed[1] = Difference(0.01, 0.004, 0.002, 0.018, "paired", 5, samples=tuple(TABLE[1][:5]))
    effect = across_seeds(per_seed)
    assert effect is not None and effect.interval == "seeds only" and effect.components is None


def test_the_noise_budget_shares_and_options() -> None:
    effect = across_seeds(_per_seed(TABLE))
    assert effect is not None and effect.components is not None
    c = effect.components
    cost = RunCost(hours=2.0, eval_minutes=3.0, n=6, on_gpu=True)
    budget = noise_budget(c, effect.df, [cost] * 6)
    total = c.seed / 3 + c.image / 6 + c.rest / 18
    assert budget.seeds + budget.images + budget.rest == pytest.approx(1)
    assert budget.images == pytest.approx(c.image / 6 / total)
    # The seed share as measured and with the seed mean square (2 df) at its one-sided 90% upper bound.
    ms_seed = 6 * stats.tvar([sum(r) / 6 for r in TABLE])
    seed_high = max(ms_seed * 2 / stats.chi2.ppf(0.1, 2) - c.rest, 0) / 6
    up_to = seed_high / 3 / (seed_high / 3 + c.image / 6 + c.rest / 18)
    assert up_to > budget.seeds + 0.2
    # Under 4 seeds the bound first, and the share the chooser prices a seed at; images and rest beside it.
    assert budget.seeds_priced is not None and budget.seeds <= budget.seeds_priced < up_to
    _, image, rest = c.shares_with(c.seed_priced)
    assert budget.seeds_priced + image + rest == pytest.approx(1)
    assert budget.words == (f"seeds up to {up_to:.0%}, priced at {budget.seeds_priced:.0%} (3 seeds: loosely "
                            f"measured) · images {image:.0%} · rest {rest:.0%}")  # fmt: skip
    seed, images = budget.narrowing
    q = stats.t.ppf(0.975, effect.df)
    assert seed.half_width == pytest.approx(q * math.sqrt(c.seed / 4 + c.image / 6 + c.rest / 24))
    assert images.half_width == pytest.approx(q * math.sqrt(c.seed / 3 + c.image / 24 + c.rest / 72))
    # One more run of each arm; 4x the images on both arms' 3 seeds at the measured 0.5 min per image.
    assert (seed.cost, seed.unit) == (4.0, "GPU-h")
    assert (images.cost, images.unit) == (pytest.approx(0.5 * 24 * 6), "GPU-min")
    assert images.half_width < seed.half_width  # here the images dominate: more images narrow it most
