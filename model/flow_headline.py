"""The held-out flow loss's headline, one number per run and checkpoint (torch-free: the controller imports
it): the (image x timestep) loss grid averaged over the timesteps with fixed weights, then over the images.

Why fixed weights: the plain mean gives the smallest timestep most of its weight (its loss and its noise are
largest there, 1/t^2 in velocity space for an x-prediction arm), so it answers "which arm is better near
t = 0" more than "which arm is better". Weighting each timestep by the inverse of its loss's variance over
the images gives each the weight its noise allows. Those variances are measured once, not per arm: a run
judged alone (the detector, best.pt, the ranking) has no comparator, and weights taken from the arm being
judged would move with it. So every arm, seed and comparison uses the same eight weights, and a difference
of two runs' headlines is exactly the headline of their difference (the effects table's val_flow_ivw).

Measured on arm A (small size, 64 held-out real photographs, step 1000, 3 training seeds on two H200s;
docs/benchmarks.md "Issue 40"): 1 / variance over the images at each of the 8 timesteps, averaged over the
seeds, normalised to sum to 1. No timestep holds more than 24% of the weight.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

HEADLINE = "val_flow_ivw"
# The weights of the 8 timesteps (i + 0.5) / 8, in order; sum 1.
FLOW_T_WEIGHTS = (3.558e-05, 0.003903, 0.0305, 0.1106, 0.2036, 0.2262, 0.2328, 0.1923)
_TOTAL = sum(FLOW_T_WEIGHTS)


def weighted_row(row: Sequence[float]) -> float | None:
    """One image's loss across the timesteps, weighted; None for a row of another width (the weights are
    for 8 timesteps) or with a value that is not a number."""
    if len(row) != len(FLOW_T_WEIGHTS) or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in row):
        return None
    return sum(w * x for w, x in zip(FLOW_T_WEIGHTS, row, strict=True)) / _TOTAL


def headline_fields(grid: Sequence[Sequence[float]]) -> dict[str, Any]:
    """The record fields of a grid's headline: the mean over the images, its SE, n and the per-image values
    (what the report pairs). Empty where the grid is not 8 timesteps wide; NaN where a cell is (diverged)."""
    rows = [weighted_row(r) for r in grid]
    if not rows or any(r is None for r in rows):
        return {}
    values: list[float] = rows  # type: ignore[assignment]
    n = len(values)
    mean = sum(values) / n
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n) if n > 1 and math.isfinite(mean) else None
    return {HEADLINE: mean, f"{HEADLINE}_se": se, f"{HEADLINE}_n": n, f"{HEADLINE}_samples": values}
