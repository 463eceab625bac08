"""`ablate nodes ...` asks the controller's REST API: what it registers is what the controller lists, a field
the API refuses is named in one line, and without a controller nothing is written on this machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.kit.net import controller_env, free_port


def ablate(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from orchestrator.cli import main; main()", *args],
                          env={**os.environ, "PYTHONPATH": os.getcwd(), **env}, cwd=cwd, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "id_ed25519"
    path.write_text("not read by add\n")
    return path


def test_a_node_added_by_the_cli_is_the_controller_s(database_url: str, key: Path, tmp_path: Path) -> None:
    with controller_env(database_url, tmp_path / "controller") as env:
        added = ablate("nodes", "add", "rest-a", "--host", "203.0.113.9", "--user", "u", "--key", str(key),
                       "--gpus", "2", "--price-per-hour", "1.5", env=env, cwd=tmp_path)  # fmt: skip
        assert added.returncode == 0, added.stderr
        auth = {"Authorization": f"Bearer {env['ABLATE_API_TOKEN']}"}
        listed = httpx.get(f"{env['ABLATE_URL']}/api/nodes", headers=auth).json()
        [node] = [n for n in listed if n["name"] == "rest-a"]
        assert (node["declared_gpus"], node["price_per_hour"], node["key_path"]) == (2, 1.5, str(key.resolve()))

        changed = ablate("nodes", "set", "rest-a", "--untrusted", "--gpus", "1", env=env, cwd=tmp_path)
        assert changed.returncode == 0 and "1 GPUs declared, not trusted" in changed.stdout, changed.stderr
        assert httpx.get(f"{env['ABLATE_URL']}/api/nodes/rest-a", headers=auth).json()["declared_gpus"] == 1

        removed = ablate("nodes", "remove", "rest-a", env=env, cwd=tmp_path)
        assert removed.returncode == 0, removed.stderr
        assert httpx.get(f"{env['ABLATE_URL']}/api/nodes/rest-a", headers=auth).status_code == 404
        again = ablate("nodes", "remove", "rest-a", env=env, cwd=tmp_path)
    assert again.returncode == 2 and "rest-a" in again.stderr and "Traceback" not in again.stderr


def test_a_field_the_api_refuses_is_named_in_one_line(database_url: str, key: Path, tmp_path: Path) -> None:
    with controller_env(database_url, tmp_path / "controller") as env:
        bad_port = ablate("nodes", "add", "rest-b", "--host", "h", "--user", "u", "--key", str(key), "--gpus", "1",
                          "--port", "70000", env=env, cwd=tmp_path)  # fmt: skip
        outside = ablate("nodes", "add", "rest-c", "--host", "h", "--user", "u", "--key", "/etc/hostname",
                         "--gpus", "1", env=env, cwd=tmp_path)  # fmt: skip
    for proc, field in ((bad_port, "port"), (outside, "key_path")):
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        [line] = proc.stderr.strip().splitlines()
        assert line.startswith(f"error: {field}:"), line
    assert "ABLATE_SSH_KEY_DIRS" in outside.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("nodes", "list"),
        ("nodes", "add", "n", "--host", "h", "--user", "u", "--key", "k", "--gpus", "1"),
        ("nodes", "set", "n", "--gpus", "1"),
        ("nodes", "probe", "n"),
        ("nodes", "remove", "n"),
    ],
)
def test_without_a_controller_a_command_says_where_it_looked(args: tuple[str, ...], tmp_path: Path) -> None:
    home = tmp_path / ".ablate"
    env = {"ABLATE_URL": f"http://127.0.0.1:{free_port()}", "ABLATE_API_TOKEN": "a-token-of-sixteen-chars",
           "ABLATE_HOME_DIR": str(home), "ABLATE_DATABASE_URL": f"sqlite:///{home / 'ablate.db'}"}  # fmt: skip
    proc = ablate(*args, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "no ablate server reachable" in line and "ABLATE_URL" in line and "--url" in line, line
    assert not list(tmp_path.rglob("*.db")), "no command that asks a controller writes a database here"
