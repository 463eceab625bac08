"""The submit answer's expected GPU-hours (orchestrator/results/deciding/expected.py): simulated grids taken
through plan_look, the rule grids run (issue 62): the split's images evaluated first where that is cheap
beside a seed, seeds only at the planned counts, each evaluation paying one worker's start."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.grids.deciding import DecideSpec
from orchestrator.results.deciding.expected import expected_gpu_hours, simulated_grid
from orchestrator.results.deciding.plan_look import NOT_JUDGED, planned_seeds
from orchestrator.results.deciding.sequential import worst_case_gpu_hours

HOURS = {"A": 6.66, "B": 3.15, "C": 3.16, "D": 3.23}
PAIRS = [("B", "A"), ("C", "B"), ("C", "A"), ("D", "C"), ("D", "A")]
START = 15 / 3600  # an evaluation worker's start


def evaluation(arm: str, n: int) -> float:
    return n * 40 / 256 / 3600  # 40 GPU-s a run on 256 images: well under a seed's 3 GPU-h


def test_an_expected_grid_evaluates_first_and_looks_only_at_planned_seed_counts() -> None:
    """On today's main the expected grid added one seed at a time, judged on the training records' 64
    images; a grid judges on the split's 256 first and buys seeds to 2, 3, 4, 5, 6, 8."""
    spec, rng = DecideSpec(), np.random.default_rng(0)
    planned = set(planned_seeds(spec.min_seeds, spec.max_seeds))
    seen: set[int] = set()
    per_image = dict.fromkeys(HOURS, evaluation("A", 1))
    for _ in range(40):
        hours, seeds, looks = simulated_grid(spec, HOURS, [("B", "A")], rng, images=64, max_images=256,
                                             image_hours=per_image, start=START)  # fmt: skip
        (first,) = looks[0]
        assert first.action == "images" and first.reason.startswith(NOT_JUDGED) and not first.fractions
        (last,) = looks[-1]
        assert set(last.seeds) <= planned and last.k in planned and last.n == 256, last
        assert set(seeds.values()) <= planned
        seen |= set(last.seeds)
        runs = sum(k * HOURS[a] for a, k in seeds.items())
        one = START + 4 * evaluation("A", 256)  # the first evaluation: 2 runs of each arm on the split
        assert runs + one <= hours <= runs + len(looks) * (START + 16 * evaluation("A", 256))
    assert {2, 3, 8} <= seen  # the null grids stop at each planned count, futile early or undecided at the budget


def test_a_clear_effect_costs_three_seeds_and_two_evaluations_with_one_start_each() -> None:
    """Every comparison clear: evaluated on the split's images first (8 runs), judged, and decided at the
    next planned count, 3 seeds (on 2 the decision's df are about 1, whose level no effect passes), where
    the 4 new runs are caught up on those images. Each evaluation's runs share one worker's start (today's
    main priced one a run, and judged on the training records' images without evaluating)."""
    expected = expected_gpu_hours(DecideSpec(), HOURS, PAIRS, images=64, max_images=256, evaluation=evaluation,
                                  start=START, effect=1.0, studies=5)  # fmt: skip
    assert expected == pytest.approx(3 * sum(HOURS.values()) + 2 * START + 12 * evaluation("A", 256))


def test_the_expected_lies_between_the_first_seeds_and_the_worst_case() -> None:
    spec = DecideSpec(min_seeds=2, max_seeds=3, futility=0.1)
    worst = worst_case_gpu_hours(HOURS, PAIRS, max_seeds=3, max_images=256, image_hours=0.0)
    expected = expected_gpu_hours(spec, HOURS, PAIRS, images=64, max_images=256, studies=50)
    assert 2 * sum(HOURS.values()) <= expected <= worst


def test_one_seed_is_read_only_where_the_seed_variance_is_borrowed() -> None:
    """min_seeds 1: without borrowed seed variances no comparison can be read on one seed, so the projection
    gives every compared arm a second seed (as a grid's look does); with them, one seed can decide."""
    alone = expected_gpu_hours(DecideSpec(min_seeds=1, max_seeds=3, futility=0.2), HOURS, PAIRS, images=64,
                               max_images=256, studies=50)  # fmt: skip
    borrows = DecideSpec(min_seeds=1, max_seeds=3, futility=0.2, borrow_from=[1])
    borrowed = expected_gpu_hours(borrows, HOURS, PAIRS, images=64, max_images=256, studies=50)
    assert alone >= 2 * sum(HOURS.values())  # every arm at two seeds at least
    assert sum(HOURS.values()) <= borrowed < alone


def test_runs_scored_in_training_pay_no_evaluation_start() -> None:
    """The same clear grid with its runs scored on the split inside their training jobs (runs/in_training.py):
    both evaluations, the first and the new seeds' catch-up, are on the split, so neither pays a start."""
    expected = expected_gpu_hours(DecideSpec(), HOURS, PAIRS, images=64, max_images=256, evaluation=evaluation,
                                  start=START, in_training=True, effect=1.0, studies=5)  # fmt: skip
    assert expected == pytest.approx(3 * sum(HOURS.values()) + 12 * evaluation("A", 256))

