"""`ablate schedules create/list/pause/resume/delete` ask the controller's REST API: what they change is what
the controller holds, a field it refuses is named in one line, and without a controller nothing is written
on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from orchestrator.db.session import session_scope
from orchestrator.fleet.inventory import NodeCreate, add_node
from tests.kit.net import controller_env, free_port

GRID = {"name": "nightly", "arms": ["A", "B"], "overrides": {"model": {"size": "tiny"}}}


def ablate(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from orchestrator.cli import main; main()", *args],
                          env={**os.environ, "PYTHONPATH": os.getcwd(), "COLUMNS": "200", **env}, cwd=cwd,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.fixture
def grid_file(tmp_path: Path) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(GRID))
    return path


def test_a_schedule_made_by_the_cli_is_the_controller_s(database_url: str, grid_file: Path, tmp_path: Path) -> None:
    key = tmp_path / "unused_ed25519"
    key.write_text("never read\n")
    with session_scope(database_url) as session:
        add_node(session, NodeCreate(name="rest-node", host="192.0.2.1", user="u", key_path=str(key), gpus=4))
    with controller_env(database_url, tmp_path / "controller") as env:
        auth, base = {"Authorization": f"Bearer {env['ABLATE_API_TOKEN']}"}, f"{env['ABLATE_URL']}/api/schedules"
        made = ablate("schedules", "create", "rest-nightly", "--cron", "0 22 * * *", "--grid", str(grid_file),
                      "--nodes", "rest-node", "--budget", "25", env=env, cwd=tmp_path)  # fmt: skip
        assert made.returncode == 0 and "first fire" in made.stdout, made.stderr
        held = httpx.get(f"{base}/rest-nightly", headers=auth).json()
        assert (held["nodes"], held["budget"], held["paused"]) == (["rest-node"], 25.0, False)

        listed = ablate("schedules", "list", "--json", env=env, cwd=tmp_path)
        assert [s["name"] for s in json.loads(listed.stdout)] == ["rest-nightly"], listed.stderr
        assert ablate("schedules", "pause", "rest-nightly", env=env, cwd=tmp_path).returncode == 0
        assert httpx.get(f"{base}/rest-nightly", headers=auth).json()["paused"] is True
        resumed = ablate("schedules", "resume", "rest-nightly", env=env, cwd=tmp_path)
        assert resumed.returncode == 0 and "next fire" in resumed.stdout, resumed.stderr
        assert httpx.get(f"{base}/rest-nightly", headers=auth).json()["paused"] is False

        assert ablate("schedules", "delete", "rest-nightly", env=env, cwd=tmp_path).returncode == 0
        assert httpx.get(f"{base}/rest-nightly", headers=auth).status_code == 404
        again = ablate("schedules", "pause", "rest-nightly", env=env, cwd=tmp_path)
    assert again.returncode == 2 and "rest-nightly" in again.stderr and "Traceback" not in again.stderr


def test_a_field_the_api_refuses_is_named_in_one_line(database_url: str, grid_file: Path, tmp_path: Path) -> None:
    with controller_env(database_url, tmp_path / "controller") as env:
        bad = ablate("schedules", "create", "rest-bad", "--cron", "at ten", "--grid", str(grid_file),
                     "--nodes", "rest-node", env=env, cwd=tmp_path)  # fmt: skip
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    [line] = bad.stderr.strip().splitlines()
    assert line.startswith("error: cron:") and "five-field" in line, line


@pytest.mark.parametrize("args", [("list",), ("pause", "s"), ("resume", "s"), ("delete", "s"), ("create", "s")])
def test_without_a_controller_a_command_says_where_it_looked(
    args: tuple[str, ...], grid_file: Path, tmp_path: Path
) -> None:
    home = tmp_path / ".ablate"
    env = {"ABLATE_URL": f"http://127.0.0.1:{free_port()}", "ABLATE_API_TOKEN": "a-token-of-sixteen-chars",
           "ABLATE_HOME_DIR": str(home), "ABLATE_DATABASE_URL": f"sqlite:///{home / 'ablate.db'}"}  # fmt: skip
    more = ("--cron", "0 22 * * *", "--grid", str(grid_file), "--nodes", "n") if args[0] == "create" else ()
    proc = ablate("schedules", *args, *more, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "no ablate server reachable" in line and "ABLATE_URL" in line and "--url" in line, line
    assert not list(tmp_path.rglob("*.db")), "no command that asks a controller writes a database here"
