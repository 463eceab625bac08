"""`ablate demo` end to end, as the Quickstart runs it: a subprocess on embedded defaults (SQLite, a
local Ray with 5 logical GPUs), then the stored result is checked (about 3 minutes on 2 cores): A-D
improve and complete, the arm whose lr jumps 500x at step 100 is stopped by the detector with its best
checkpoint kept, and the tables and the dashboard's data say so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import create_engine, text

from orchestrator.dashboard.data import grid_detail
from orchestrator.db.models import Grid
from orchestrator.db.session import session_scope

BROKEN = "A-lr500x"


def test_demo_trains_five_arms_and_the_detector_stops_the_broken_one(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ABLATE_", "RAY_"))}
    # offline: nothing downloads, LPIPS is the labelled stand-in
    env.update(ABLATE_HOME_DIR=str(tmp_path), ABLATE_OFFLINE="1", PYTHONUNBUFFERED="1", COLUMNS="250")
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "demo"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = proc.stdout[proc.stdout.index("result per arm"):]

    database_url = f"sqlite:///{tmp_path / 'demo.db'}"
    engine = create_engine(database_url)
    with engine.connect() as conn:
        runs = {r.arm: r for r in conn.execute(text(
            "SELECT id, grid_id, arm, state, gpu_index, decision, decision_step, best_step, best_value, "
            "best_checkpoint FROM runs"
        ))}
        first_rows = conn.execute(text(
            "SELECT run_id, val_flow_loss FROM metrics m "
            "WHERE step = (SELECT MIN(step) FROM metrics WHERE run_id = m.run_id)"
        )).all()
        firsts = {run_id: value for run_id, value in first_rows}
        labels = {row[0] for row in conn.execute(text("SELECT DISTINCT lpips_backbone FROM metrics"))}
    engine.dispose()

    assert sorted(runs) == sorted(["A", "B", "C", "D", BROKEN])
    assert len({r.gpu_index for r in runs.values()}) == 5, "each arm pinned to its own logical GPU"
    for arm in "ABCD":
        r = runs[arm]
        assert (r.state, r.decision) == ("completed", None), (arm, r.state, r.decision)  # never flagged
        # Offline, LPIPS is the stand-in: the detector judges the held-out flow loss ("auto"), and so do the tables.
        assert r.best_value < firsts[r.id], f"arm {arm}: val_flow_loss never improved on its first checkpoint"
        assert r.best_checkpoint and Path(r.best_checkpoint).exists()
    broken = runs[BROKEN]
    assert broken.state == "stopped" and broken.decision in {"collapse", "diverged"}, (broken.state, broken.decision)
    # It turns NaN 6-7 steps after the jump: `diverged` at step 150 in every case bench/demo_broken_arm.py
    # measured; issue 22 asks for a stop by step 300 of 400 whatever the CPU.
    assert broken.decision_step <= 300, f"stopped only at step {broken.decision_step}"
    assert broken.best_step < broken.decision_step and Path(broken.best_checkpoint).exists()
    assert labels == {"random_standin"}, "offline demo metrics are labelled as stand-in LPIPS"

    # The final table and the lines under it: the stop, its reason, the kept checkpoint, the hours saved.
    assert f"stopped / {broken.decision} @{broken.decision_step}" in result and "CPU-h saved" in result
    assert f"{BROKEN} stopped by the detector at step {broken.decision_step}" in result
    kept = Path(broken.best_checkpoint).relative_to(tmp_path)  # shown relative to the folder the demo ran in
    assert f"kept its best checkpoint, step {broken.best_step}: {kept}" in result
    assert "reason: " in result and "=nan" in result
    assert "best held-out flow loss (weighted headline) ± SE" in result  # the judge leads, not the stand-in LPIPS
    broken_row = next(line for line in result.splitlines() if line.startswith(f"│ {BROKEN}"))
    assert broken_row.rstrip(" │").endswith(" s)"), broken_row  # "0.0221 (80 s)": hours saved, with seconds

    # The dashboard's data for the grid marks the stop (the page draws it as ✕ with the reason).
    with session_scope(database_url) as session:
        grid = grid_detail(session, session.get(Grid, broken.grid_id))
    stops = {r["arm"]: (r["stopped"], r["decision_step"]) for r in grid["runs"]}
    assert stops[BROKEN] == (True, broken.decision_step) and not any(stops[a][0] for a in "ABCD")
