"""bench/decide_sim.py at a tiny size (the default spec's cells): it still runs the decision loop end to end
and ends with its one summary line, and the null comparisons are seldom called (loosely: 30 studies a cell
cannot measure 5%)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
LINE = re.compile(r"^gpu_hours_vs_fixed3 (\S+) type_I (\S+) power (\S+) hours_vs_best_fixed (\S+)$")


def run_sim(*extra: str, variants: tuple[str, ...] = ("default",)) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    chosen = [x for v in variants for x in ("--variant", v)]
    args = [sys.executable, "bench/decide_sim.py", "--studies", "30", "--workers", "1", *chosen, *extra]
    out = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=True).stdout
    return out.strip().splitlines()


def test_the_simulation_ends_with_its_line_and_holds_type_one_loosely() -> None:
    """At the product's default DecideSpec (max_seeds 8, read from DecideSpec(), not a bench-own design)."""
    lines = run_sim(variants=("default", "equal power"))
    found = LINE.match(lines[-1])
    assert found, lines[-1]
    hours, type_one, power, vs_best = map(float, found.groups())
    assert vs_best > 0  # against the cheapest fixed k x n design at the grid's power (bench/equal_power.py)
    assert 0 <= type_one <= 0.15  # 60 null comparisons a cell, the largest of 7 cells' cumulative rates
    assert power >= 0  # the power at 2 SE; 30 studies call the smallest effects too seldom to bound it
    assert any(line.startswith("default: Design(min_seeds=2, max_seeds=8,") for line in lines)
    big = next(line for line in lines if line.startswith("| default | headline | 1x | 0.0075 |"))
    called = [float(x.split()[0]) for x in big.split("|")[6].split("/")]  # C-B, C-A, D-A (fixed)
    assert min(called) >= 0.8  # 0.0075 is 5 SE on the headline: called in nearly every study
    assert 2 / 3 < hours < 8 / 3  # two seeds of every arm at least, eight at most, and the images
    assert sum(line.startswith("| default | headline |") for line in lines) == 3


def test_borrowed_seed_variances_decide_on_fewer_gpu_hours() -> None:
    """`--earlier 3 --min-seeds 1`: each arm's seed variance pooled with an earlier 3-seed grid's of it, so
    one seed can be read. On the headline with a clear effect (5 SE) it calls the same comparisons for
    far fewer GPU-hours than its own seeds alone (which need a third seed there: 0.94 of the fixed design's at
    10,000 studies, against 0.57), and never below one seed of every arm. At max_seeds 3, where the saving
    on the decided comparisons is not hidden under the null comparisons' seeds up to the budget."""

    def big_effect_row(*extra: str) -> list[str]:
        lines = run_sim(*extra)
        return next(line for line in lines if line.startswith("| default | headline | 1x | 0.0075 |")).split("|")

    default = big_effect_row("--max-seeds", "3")
    borrowed = big_effect_row("--max-seeds", "3", "--earlier", "3", "--min-seeds", "1")
    called = [float(x.split()[0]) for x in borrowed[6].split("/")]
    assert min(called) >= 0.8
    assert 1 / 3 <= float(borrowed[7]) < float(default[7]) - 0.15


def test_the_ratio_interpolated_between_the_fixed_designs_around_the_grids_power() -> None:
    """bench/equal_power.py: a grid of power 0.878 is held against 7 x 256 (the first at or above it) though
    6 x 256 reached 0.874; interpolated between the two, the fixed design at 0.878 costs a tenth of the way
    from one to the other, and the ratio says so."""
    from bench.equal_power import design_hours, equal_power

    hours = {"A": 6.66, "B": 3.15, "C": 3.16, "D": 3.23}
    image = 10.0 / 64 / 3600
    fixed = {(6, 256): 0.874, (7, 256): 0.912, (5, 256): 0.80, (8, 64): 0.85}
    e = equal_power(0.878, [60.0, 90.0, 120.0], fixed, hours, image)
    six, seven = design_hours(6, 256, hours, image), design_hours(7, 256, hours, image)
    assert e.best == (7, 256) and e.ratio == 90.0 / seven
    at = six + (0.878 - 0.874) / (0.912 - 0.874) * (seven - six)
    assert abs(e.interpolated - 90.0 / at) < 1e-12 and e.interpolated > e.ratio
