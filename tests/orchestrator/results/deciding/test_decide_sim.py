"""bench/decide_sim.py at a tiny size: it still runs the decision loop end to end and ends with its one
summary line, and the null comparisons are seldom called (loosely: 30 studies a cell cannot measure 5%)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
LINE = re.compile(r"^type_I (\S+) power (\S+) gpu_hours_vs_fixed3 (\S+)$")


def test_the_simulation_ends_with_its_line_and_holds_type_one_loosely() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "bench/decide_sim.py", "--studies", "30", "--workers", "1"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=600, check=True).stdout  # fmt: skip
    lines = out.strip().splitlines()
    found = LINE.match(lines[-1])
    assert found, lines[-1]
    type_one, power, hours = map(float, found.groups())
    assert 0 <= type_one <= 0.15  # 60 null comparisons a cell, the largest of 8 cells' cumulative rates
    assert power >= 0  # a ratio; 30 studies call the smallest effects too seldom to bound it
    big = next(line for line in lines if line.startswith("| headline | 1x | 0.0075 |"))
    called = [float(x.split()[0]) for x in big.split("|")[5].split("/")]  # C-B, C-A, D-A (fixed)
    assert min(called) >= 0.8  # 0.0075 is 5 SE on the headline: called in nearly every study
    assert 0.6 < hours < 1.3  # two seeds of every arm at least, three at most, and the images
    assert sum(line.startswith("| headline |") for line in lines) == 4


def test_borrowed_seed_variances_decide_on_fewer_gpu_hours() -> None:
    """`--earlier 3 --min-seeds 1`: each arm's seed variance pooled with an earlier 3-seed grid's of it, so
    one seed can be read. On the headline with a clear effect (5 SE) it calls the same comparisons for
    far fewer GPU-hours than the default (which needs a third seed there: 0.94 of the fixed design's at
    10,000 studies, against 0.57), and never below one seed of every arm."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def big_effect_row(*extra: str) -> list[str]:
        args = [sys.executable, "bench/decide_sim.py", "--studies", "30", "--workers", "1", *extra]
        out = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=True).stdout
        row = next(line for line in out.splitlines() if line.startswith("| headline | 1x | 0.0075 |"))
        return row.split("|")

    default, borrowed = big_effect_row(), big_effect_row("--earlier", "3", "--min-seeds", "1")
    called = [float(x.split()[0]) for x in borrowed[5].split("/")]
    assert min(called) >= 0.8
    assert 1 / 3 <= float(borrowed[6]) < float(default[6]) - 0.15
