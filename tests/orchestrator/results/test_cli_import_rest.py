"""`ablate import` reads the file here and sends its curves to the controller's POST /api/grids/import: the
grid it makes is the controller's, a diverged (NaN) curve travels, a refused field is named in one line, and
without a controller nothing is written on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.kit.net import controller_env, free_port

CHECKPOINTS = [{"step": s, "recon_lpips": v, "elapsed_hours": s / 100}
               for s, v in ((100, 0.99), (200, 0.97), (300, 0.95))]


def ablate(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from orchestrator.cli import main; main()", *args],
                          env={**os.environ, "PYTHONPATH": os.getcwd(), **env}, cwd=cwd, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def curves_file(tmp_path: Path) -> Path:
    """Arm A, and arm B whose last checkpoint is NaN (diverged); B started at a known time."""
    broken = [*CHECKPOINTS[:2], {**CHECKPOINTS[2], "recon_lpips": float("nan")}]
    doc = {"A_base": {"checkpoints": CHECKPOINTS},
           "B_tread": {"start_time": "2026-05-07T16:28:36+00:00", "checkpoints": broken}}  # fmt: skip
    path = tmp_path / "curves.json"
    path.write_text(json.dumps(doc))  # NaN as its literal, as the curves files of a diverged run hold it
    return path


def test_an_import_is_the_controller_s_grid(database_url: str, tmp_path: Path) -> None:
    with controller_env(database_url, tmp_path / "controller") as env:
        out = ablate("import", str(curves_file(tmp_path)), "--name", "rest import", env=env, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert "B: stopped   diverged @300" in out.stdout, out.stdout
        grid_id = int(out.stdout.split()[1])
        grid = httpx.get(f"{env['ABLATE_URL']}/api/grids/{grid_id}").json()
    assert (grid["name"], grid["source"], grid["control"]) == ("rest import", "imported", "A")
    runs = {r["arm"]: r for r in grid["runs"]}
    assert (runs["A"]["state"], runs["B"]["decision"]) == ("completed", "diverged")
    assert runs["B"]["started_at"].startswith("2026-05-07T16:28:36")


def test_what_the_controller_refuses_is_named_in_one_line(database_url: str, tmp_path: Path) -> None:
    path = curves_file(tmp_path)
    with controller_env(database_url, tmp_path / "controller") as env:
        long_name = ablate("import", str(path), "--name", "x" * 201, env=env, cwd=tmp_path)
        bad_control = ablate("import", str(path), "--name", "ctl", "--control", "Q", env=env, cwd=tmp_path)
        auth, api = {"Authorization": f"Bearer {env['ABLATE_API_TOKEN']}"}, f"{env['ABLATE_URL']}/api/grids/import"
        direct = httpx.post(api, json={"name": "x", "curves": {"A": {"checkpoints": [{"step": -1}]}}}, headers=auth)
        huge = httpx.post(api, json={"name": "x", "curves": {"A": {"checkpoints": [{"step": 10**30}]}}}, headers=auth)
        wrong = {**env, "ABLATE_API_TOKEN": "x" * 20}
        wrong_token = ablate("import", str(path), "--name", "t", env=wrong, cwd=tmp_path)
    for proc, field in ((long_name, "name"), (bad_control, "control")):
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        [line] = proc.stderr.strip().splitlines()
        assert line.startswith(f"error: {path}: {field}"), line
    assert direct.status_code == 422 and direct.json()["detail"][0]["loc"] == ["body", "curves"], direct.text
    assert "'step' must be a non-negative integer" in direct.json()["detail"][0]["msg"]
    assert huge.status_code == 422 and "cannot store" in huge.json()["detail"][0]["msg"], huge.text  # not a 500
    assert wrong_token.returncode == 2 and "rejected the API token" in wrong_token.stderr, wrong_token.stderr


def test_without_a_controller_an_import_says_where_it_looked(tmp_path: Path) -> None:
    home = tmp_path / ".ablate"
    env = {"ABLATE_URL": f"http://127.0.0.1:{free_port()}", "ABLATE_API_TOKEN": "a-token-of-sixteen-chars",
           "ABLATE_HOME_DIR": str(home), "ABLATE_DATABASE_URL": f"sqlite:///{home / 'ablate.db'}"}  # fmt: skip
    proc = ablate("import", str(curves_file(tmp_path)), "--name", "nowhere", env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "no ablate server reachable" in line and "ABLATE_URL" in line and "--url" in line, line
    assert not list(tmp_path.rglob("*.db")), "an import writes no database here: the controller holds it"
