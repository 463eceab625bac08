"""The soak benchmark (bench/soak.py) stays runnable: its environment started for a few seconds, as the
benchmark starts it (Postgres of its own, a tmpfs store, a local Ray, the controller as a child process),
with one grid and one fault (Postgres restarted mid-ingest). A split of the script that breaks how the
controller is started fails here, not at the next soak."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PG_BIN = Path("/usr/lib/postgresql/15/bin")  # bench/soak_env.py PG_BIN

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not (PG_BIN / "initdb").exists() or shutil.which("runuser") is None,
    reason="the soak needs root (a tmpfs mount, initdb as the postgres user) and PostgreSQL 15",
)


def test_the_soak_starts_its_controller_takes_a_grid_and_recovers_from_a_postgres_restart(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    # 12 s of load: the grid at once, the Postgres restart at 7 s, no second fault. 40 records 0.3 s apart:
    # every run still writes records after the restart, whenever it started (ingest must resume).
    cmd = [sys.executable, str(REPO / "bench" / "soak.py"), "--minutes", "0.2", "--fault-every", "7",
           "--submit-every", "600", "--steps", "200", "--every", "5", "--record-delay", "0.3",
           "--gpus", "4", "--drain-timeout", "120", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["grids_stored"] == 1
    assert report["runs_by_state"] == {"completed": 4}
    assert report["records_stored"] == report["records_produced_by_completed_runs"] == 4 * 40
    assert report["records_lost_of_completed_runs"] == 0
    assert report["duplicated_checkpoint_events"] == 0
    # 503 (with Retry-After) is the answer while the database restarts; any other 5xx is a bug
    assert set(report["5xx_by_status"]) <= {"503"}, report["5xx_samples"]
    [fault] = report["faults"]
    assert fault["fault"].startswith("postgres restart")
    assert fault["api_ok_s"] is not None and fault["ingest_s"] is not None  # the API and ingest came back
