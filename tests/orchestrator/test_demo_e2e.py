"""`ablate demo` end to end, as the Quickstart runs it: a subprocess on embedded defaults (SQLite, a
local Ray with 4 logical GPUs), then the stored result is checked (about 90 s on 2 cores)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import create_engine, text


def test_demo_trains_arms_a_to_d_on_four_gpus_and_improves_lpips(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ABLATE_", "RAY_"))}
    env.update(ABLATE_STORAGE_DIR=str(tmp_path), PYTHONUNBUFFERED="1", COLUMNS="160")
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "demo"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "result per arm" in proc.stdout

    engine = create_engine(f"sqlite:///{tmp_path / 'demo.db'}")
    with engine.connect() as conn:
        runs = conn.execute(text("SELECT id, arm, state, gpu_index, best_value, best_checkpoint FROM runs")).all()
        first_rows = conn.execute(text(
            "SELECT run_id, recon_lpips FROM metrics m "
            "WHERE step = (SELECT MIN(step) FROM metrics WHERE run_id = m.run_id)"
        )).all()
        firsts = {run_id: value for run_id, value in first_rows}
        labels = {row[0] for row in conn.execute(text("SELECT DISTINCT lpips_backbone FROM metrics"))}
    engine.dispose()

    assert sorted(r.arm for r in runs) == ["A", "B", "C", "D"]
    assert {r.state for r in runs} <= {"completed", "stopped"}
    assert len({r.gpu_index for r in runs}) == 4, "each arm pinned to its own logical GPU"
    for r in runs:
        assert r.best_value < firsts[r.id], f"arm {r.arm}: recon LPIPS never improved on its first checkpoint"
        assert r.best_checkpoint and Path(r.best_checkpoint).exists()
    assert labels == {"random_standin"}, "offline demo metrics are labelled as stand-in LPIPS"
