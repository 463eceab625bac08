"""The submit answer's cost line: a tiny grid's projected GPU-hours read as a number, not "about 0.0"
(issue 64 item 7), and a seed-size grid's as before."""

from __future__ import annotations

import re

from orchestrator.grids.replicates import GridCost, grid_cost
from orchestrator.grids.service import GridCreate, resolve_grid


def _cost(arms: list[str], seeds: int, **overrides: object) -> GridCost:
    specs = [spec for _, spec in resolve_grid(GridCreate(name="cost", arms=arms, overrides=overrides))]
    return grid_cost(specs, seeds)


def test_a_tiny_grid_says_its_hours_with_significant_digits_and_its_seconds() -> None:
    cost = _cost(["A", "B"], 1, model={"size": "tiny"}, schedule={"steps": 100})
    text = cost.text()
    assert 0 < cost.projected < 1e-3 and "about 0.0 GPU" not in text and "about 0 GPU" not in text, text
    seconds = float(re.search(r", ([0-9.]+) GPU-seconds \(projected", text).group(1))  # type: ignore[union-attr]
    assert abs(seconds - cost.projected * 3600) <= 0.05 * cost.projected * 3600, text


def test_hours_keep_two_significant_digits_below_ten_and_one_decimal_above() -> None:
    # The real-GPU tiny grid: 0.0023 GPU-hours, which the answer printed as "about 0.0".
    assert "about 0.0023 GPU-hours, 8.3 GPU-seconds (projected" in GridCost(2, 1, 2, 0.0023, 0.0023).text()
    assert "about 3.2 GPU-hours (projected" in GridCost(4, 1, 4, 3.18, 3.18).text()
    seed_size = _cost(["A", "B", "C", "D"], 3)
    assert f"about {seed_size.projected:,.1f} GPU-hours (projected" in seed_size.text()
    assert "GPU-seconds" not in seed_size.text()


def test_one_seed_and_one_arm_read_singular() -> None:
    """Issue 64 item 7: "3 arms x 1 seeds = 3 runs" read so on a one-seed grid."""
    assert GridCost(3, 1, 3, 2.0, 2.0).text().startswith("3 arms x 1 seed = 3 runs, ")
    assert GridCost(1, 1, 1, 2.0, 2.0).text().startswith("1 arm x 1 seed = 1 run, ")
    assert GridCost(2, 3, 6, 2.0, 2.0).text().startswith("2 arms x 3 seeds = 6 runs, ")
