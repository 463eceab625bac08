"""bench/decide_sim.py at a tiny size: it still runs the decision loop end to end and ends with its one
summary line, and the null comparisons are seldom called (loosely: 30 studies a cell cannot measure 5%)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
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
