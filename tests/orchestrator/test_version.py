"""The version a user sees: `ablate --version`, /healthz and the report say the same, from
orchestrator/version.py; a source tree without installed metadata says "source tree, commit ..."."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from fastapi.testclient import TestClient

from orchestrator.app import create_app
from orchestrator.settings import Settings
from orchestrator.version import DISTRIBUTION, same_code

REPO = Path(__file__).resolve().parents[2]
AUTH = {"Authorization": "Bearer t"}
# Where the version is read: this file alone needs nothing beyond the standard library.
PROBE = "import orchestrator.version as v; print(v.__file__); print(v.version_text())"


def ablate_version(cwd: Path) -> str:
    exe = shutil.which("ablate")
    cmd = [exe] if exe else [sys.executable, "-m", "orchestrator.cli"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    proc = subprocess.run([*cmd, "--version"], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_the_command_the_health_check_and_the_report_say_one_version(database_url: str, tmp_path: Path) -> None:
    printed = ablate_version(tmp_path)
    with TestClient(create_app(Settings(database_url=database_url, home_dir=tmp_path / "home"), "t")) as client:
        said = client.get("/healthz").json()["version"]
        created = client.post("/api/grids", json={"name": "versioned", "arms": ["A", "B"]}, headers=AUTH)
        assert created.status_code == 201, created.text
        report = f"/api/grids/{created.json()['id']}/report"
        in_json = client.get(f"{report}.json").json()["version"]
        markdown, html = client.get(f"{report}.md").text, client.get(f"{report}.html").text
    assert printed == f"{DISTRIBUTION} {said}"
    assert in_json == said and f"by {DISTRIBUTION} {said}." in markdown and f"by {DISTRIBUTION} {said}." in html
    assert said != "unknown" and "unknown" not in said
    if (REPO / ".git").exists():  # this checkout: its commit, whatever pip installed beside it
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
        assert said.startswith("source tree, commit ") and head.startswith(said.removeprefix("source tree, commit "))


def _copied_tree(tmp_path: Path) -> Path:
    """orchestrator/ copied as a GPU node gets it: no .git, no dist-info, no version file."""
    tree = tmp_path / "copy"
    shutil.copytree(REPO / "orchestrator", tree / "orchestrator",
                    ignore=shutil.ignore_patterns("__pycache__", "_version.py"))  # fmt: skip
    return tree


def _probe(tree: Path) -> tuple[str, str]:
    """(the file that answered, the version text) from `python -S` (no site-packages: no installed
    metadata at all) with only `tree` on PYTHONPATH."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-S", "-c", PROBE]
    proc = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    where, text = proc.stdout.splitlines()
    return where, text


def test_a_copied_tree_without_metadata_names_its_commit_from_git_or_the_version_file(tmp_path: Path) -> None:
    tree = _copied_tree(tmp_path)
    where, text = _probe(tree)
    assert Path(where).is_relative_to(tree)  # the copy answered, not an installed package
    assert text == "source tree, commit unknown"  # nothing to read: said so, never a bare "unknown"

    # The version file setuptools-scm writes at build time, copied along with the tree.
    (tree / "orchestrator" / "_version.py").write_text("version = '0.1.dev7+g1a2b3c4d'\ncommit_id = 'g1a2b3c4d'\n")
    assert _probe(tree)[1] == "source tree, commit 1a2b3c4d"

    # A tree with its .git: the commit git says (over a version file that may be stale).
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "orchestrator/version.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "copy"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    text = _probe(tree)[1]
    assert text.startswith("source tree, commit ") and head.startswith(text.removeprefix("source tree, commit "))


def test_same_code_matches_a_wheel_and_the_tree_it_was_built_from() -> None:
    """What bootstrap uses to skip a node's install (orchestrator/fleet/bootstrap.py)."""
    assert same_code("0.1.dev3+g1a2b3c4", "source tree, commit 1a2b3c4d5")
    assert same_code("0.2.0 (commit 1a2b3c4)", "0.2.1.dev1+g1a2b3c4.d20261128")
    assert same_code("0.2.0", "0.2.0")
    assert not same_code("0.1.dev3+g1a2b3c4", "source tree, commit 9f8e7d6c")
    assert not same_code("0.0.1", "source tree, commit 1a2b3c4")  # an older environment: install
    assert not same_code("source tree, commit unknown", "source tree, commit unknown")  # may differ: install
