"""A comparison's seeds read unpaired where the grid's seeds share no effect (orchestrator/results/deciding/
unpaired.py): the F test finds a seed effect every arm shares and passes seeds that share none at its own
level, the unpaired reading has Welch's variance on more df than the paired one, and its intervals cover the
true difference where it is chosen, with and without a shared effect, and with one arm's seeds 3x wider."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import t as student

from orchestrator.results.deciding.borrowed import SeedVariance
from orchestrator.results.deciding.unpaired import SHARED_P, shared_seed_test, unpaired_look, unpaired_reading


def by_seed(table: np.ndarray, arms: str = "ABCD") -> dict[str, dict[int, float]]:
    return {a: dict(enumerate(map(float, row))) for a, row in zip(arms, table, strict=False)}


def draw(rng: np.random.Generator, k: int, own: float, shared: float, spread: float = 1.0) -> np.ndarray:
    """Four arms' run values on k seeds: seed s shared by every arm (SD `shared`), each arm its own (SD
    `own`, arm D's `spread` times it)."""
    sd = np.array([own, own, own, own * spread])[:, None]
    return rng.normal(0, shared, (1, k)) + rng.normal(0, 1, (4, k)) * sd


def test_a_seed_effect_every_arm_shares_is_found_and_none_passes_at_its_level() -> None:
    rng = np.random.default_rng(5)
    shared = [shared_seed_test(by_seed(draw(rng, 4, 0.1, 1.0)), range(4)) for _ in range(200)]
    assert all(s is not None for s in shared)
    assert np.mean([s.p < SHARED_P for s in shared]) > 0.99  # type: ignore[union-attr]
    apart = [shared_seed_test(by_seed(draw(rng, 3, 1.0, 0.0)), range(3)) for _ in range(4000)]
    passed = np.mean([s.p >= SHARED_P for s in apart])  # type: ignore[union-attr]
    assert abs(passed - (1 - SHARED_P)) < 0.025  # an exact F test: p uniform where nothing is shared
    first = apart[0]
    assert first is not None and first.df == (2, 6) and first.arms == 4


def test_the_test_needs_three_residual_df_over_arms_on_every_seed() -> None:
    runs = {"A": {0: 1.0, 1: 2.0, 2: 0.0}, "B": {0: 1.5, 2: 0.5}, "C": {0: 0.0, 1: 1.0, 2: 2.0},
            "D": {0: 2.0, 1: 0.0, 2: 1.0}}  # fmt: skip
    test = shared_seed_test(runs, [0, 1, 2])
    assert test is not None and test.arms == 3 and test.df == (2, 4)  # A, C and D (B lacks seed 1)
    assert shared_seed_test(runs, [0, 1]) is None  # three arms on two seeds: 2 df, too few to tell
    assert shared_seed_test({a: runs[a] for a in "AC"}, [0, 1, 2]) is None  # two arms on three seeds: 2 df
    assert unpaired_reading(runs, "A", "B", [0, 1, 2], SeedVariance(1e-4, 63), 0.1) is None  # B lacks seed 1
    two = {"A": {s: float(s % 2) for s in range(4)}, "B": {s: float(s // 2) for s in range(4)}}
    assert shared_seed_test(two, range(3)) is None and shared_seed_test(two, range(4)) is not None


def test_unpaired_reads_welch_on_more_df_and_paired_stays_where_seeds_share() -> None:
    runs = {"A": {0: 0.0, 1: 2.0, 2: 1.0}, "B": {0: 2.0, 1: 1.0, 2: 0.0}, "C": {0: 1.0, 1: 0.0, 2: 2.0}}  # 4 df
    images = SeedVariance(0.0, 255)
    r = unpaired_reading(runs, "A", "B", [0, 1, 2], images, 0.0)
    assert r is not None and r.test.p >= SHARED_P  # seed means all 1.0: no shared effect
    assert r.seeds.value == pytest.approx(2.0)  # each arm's spread 1.0, summed
    assert r.se == pytest.approx(math.sqrt(2.0 / 3))
    assert r.df == pytest.approx(4.0)  # Welch's df at equal spreads: 2 (k - 1), where paired reads 2
    assert "unpaired" in r.note and "p 1" in r.note
    shared = {a: {s: v + 10.0 * s for s, v in vals.items()} for a, vals in runs.items()}  # seed s moves every arm
    assert unpaired_reading(shared, "A", "B", [0, 1, 2], images, 0.0) is None
    assert unpaired_look(runs, "A", "B", 2, 64, images) is None  # the look's k must be the seeds both ran


@pytest.mark.parametrize(("shared", "spread"), [(0.0, 1.0), (0.0, 3.0), (0.5, 1.0), (1.0, 1.0)])
def test_the_chosen_reading_covers_the_true_difference(shared: float, spread: float) -> None:
    """Known truth, no difference between arms: D - C's 95% interval (t on the reading's df) where the look
    reads it unpaired, else the paired t on k - 1 df, at 3 and 5 seeds; covers 93-97.5% of 3,000 draws a
    setting (the chosen reading's coverage is what the error rate rests on)."""
    rng = np.random.default_rng(11)
    images = SeedVariance(0.0, 255)
    for k in (3, 5):
        covered = 0
        for _ in range(3000):
            table = draw(rng, k, 1.0, shared, spread)
            look = unpaired_look(by_seed(table), "D", "C", k, 256, images)
            diff = table[3] - table[2]
            if look is not None:
                half = float(student.ppf(0.975, look[0].df)) * look[0].se
            else:
                half = float(student.ppf(0.975, k - 1)) * float(diff.std(ddof=1)) / math.sqrt(k)
            covered += abs(float(diff.mean())) <= half
        assert 0.93 <= covered / 3000 <= 0.975, (k, covered / 3000)


def test_a_look_reads_a_comparison_unpaired_only_where_the_grids_seeds_share_nothing() -> None:
    """decider.py reading_of on a crossed effect of B - A (3 seeds x 64 images) with the grid's four arms'
    runs by seed: unpaired (Welch's df, above the paired decision df, the reason saying why) where the
    runs share no seed effect; the paired reading where seed s moves every arm alike."""
    from orchestrator.grids.deciding import DecideSpec
    from orchestrator.results.deciding.decider import reading_of
    from orchestrator.results.deciding.sequential import decision_df
    from orchestrator.results.reports.costs import RunCost
    from orchestrator.results.reports.crossed import crossed_interval
    from orchestrator.results.reports.effects import noise_budget
    from orchestrator.results.reports.model import Effect
    from orchestrator.results.reports.stats import t_quantile

    rng = np.random.default_rng(4)  # a draw whose two arms spread alike: Welch's df near 2 (k - 1)
    k, n = 3, 64
    arms = rng.normal(0, 0.006, (4, k, 1)) + rng.normal(0, 0.0015, (4, 1, n)) + rng.normal(0, 0.004, (4, k, n))
    crossed = crossed_interval((arms[1] - arms[0]).tolist(), t_quantile)
    assert crossed is not None
    c = crossed.components
    budget = noise_budget(c, c.df, [RunCost(hours=1.0, eval_minutes=None, n=n, on_gpu=True)] * 2 * k)
    e = Effect(arm="B", metric="val_flow_ivw", against="control", other_arm="A", step=100, diff=crossed.mean,
               low=crossed.low, high=crossed.high, k=k, seed_sd=None, eval_se=None, noise="", interval="crossed",
               se=crossed.se, df=c.df, n=n, budget=budget, reading="within noise", per_seed=[])  # fmt: skip
    runs = by_seed(arms.mean(axis=2))
    apart = reading_of(e, DecideSpec(), runs=runs)
    paired = reading_of(e, DecideSpec())
    assert "seeds read unpaired" in apart.note and "unpaired" not in paired.note
    assert paired.df == pytest.approx(decision_df(c, k, n), rel=1e-3)  # about k - 1: the seeds' own
    assert apart.df is not None and paired.df is not None and apart.df > 1.5 * paired.df
    assert apart.se == pytest.approx(math.sqrt(sum(np.var(arms[i].mean(axis=1), ddof=1) for i in (0, 1)) / k
                                               + c.image / n + c.rest / (k * n)), rel=1e-3)  # fmt: skip
    shared = {a: {s: v + 0.1 * s for s, v in vals.items()} for a, vals in runs.items()}
    assert "unpaired" not in reading_of(e, DecideSpec(), runs=shared).note
