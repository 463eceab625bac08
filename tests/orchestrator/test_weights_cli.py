"""`ablate weights list` and `ablate weights fetch NAME` (orchestrator/cli/weights.py). Nothing is downloaded:
offline is real here (this process has ABLATE_OFFLINE=1), and the staged files are tiny ones pinned by real
registry entries."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from model.extractors import EXTRACTORS, PinnedFile


def _ablate(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ABLATE_", "HF_"))}
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          env={**clean, **env}, timeout=120)


def test_fetch_offline_exits_non_zero_with_one_line_saying_where_to_put_the_files(tmp_path: Path):
    done = _ablate("weights", "fetch", "clip-vit-l-14-336",
                   env={"ABLATE_OFFLINE": "1", "ABLATE_HOME_DIR": str(tmp_path)})
    assert done.returncode != 0 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    pinned = EXTRACTORS["clip-vit-l-14-336"].files[0]
    for needed in ("ABLATE_OFFLINE", str(tmp_path / "weights" / "clip-vit-l-14-336"), pinned.filename,
                   pinned.sha256, "ABLATE_WEIGHTS_DIR"):
        assert needed in lines[0]
    assert not (tmp_path / "checkpoints" / "weights").exists()


def test_fetch_with_no_route_to_the_hub_is_one_line_too(tmp_path: Path):
    """HF_HUB_OFFLINE makes huggingface_hub fail as it does with no network, at once instead of after retries."""
    done = _ablate("weights", "fetch", "dinov2-vit-b-14",
                   env={"ABLATE_OFFLINE": "0", "HF_HUB_OFFLINE": "1", "ABLATE_HOME_DIR": str(tmp_path)})
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "could not be downloaded from facebook/dinov2-base" in lines[0] and "ABLATE_WEIGHTS_DIR" in lines[0]


def test_an_unknown_name_is_one_line_listing_the_known_ones(tmp_path: Path):
    done = _ablate("weights", "fetch", "inception-v3", env={"ABLATE_HOME_DIR": str(tmp_path)})
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "'inception-v3'" in lines[0]
    assert all(name in lines[0] for name in EXTRACTORS)


def test_list_shows_every_pin(tmp_path: Path):
    done = _ablate("weights", "list", env={"ABLATE_HOME_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    for entry in EXTRACTORS.values():
        assert entry.name in done.stdout and entry.repo in done.stdout and entry.revision in done.stdout
        assert all(f.sha256 in done.stdout for f in entry.files)


def test_fetch_stages_a_verified_local_file_in_the_store_once_and_refuses_a_tampered_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from typer.testing import CliRunner

    from orchestrator.cli import CLIError, _register, app

    _register()
    weights, store = tmp_path / "weights", tmp_path / "store"
    local = weights / "tiny" / "model.safetensors"
    local.parent.mkdir(parents=True)
    local.write_bytes(b"pinned tiny weights")
    pinned = PinnedFile(local.name, hashlib.sha256(local.read_bytes()).hexdigest(), local.stat().st_size)
    monkeypatch.setitem(EXTRACTORS, "tiny", replace(EXTRACTORS["dinov2-vit-b-14"], name="tiny", files=(pinned,)))
    monkeypatch.setenv("ABLATE_WEIGHTS_DIR", str(weights))
    monkeypatch.setenv("ABLATE_CHECKPOINT_URL", f"file://{store}")

    first = CliRunner().invoke(app, ["weights", "fetch", "tiny"])
    assert first.exit_code == 0, first.output
    assert (store / "weights" / "tiny" / "model.safetensors").read_bytes() == b"pinned tiny weights"
    assert "staged in" in first.output and "sha256-checked" in first.output
    again = CliRunner().invoke(app, ["weights", "fetch", "tiny"])
    assert again.exit_code == 0 and "already staged" in again.output
    listed = CliRunner().invoke(app, ["weights", "list"], env={"COLUMNS": "400"})
    assert any(line.startswith("│ tiny") and "staged" in line for line in listed.output.splitlines())

    (store / "weights" / "tiny" / "model.safetensors").unlink()
    local.write_bytes(b"pinned tiny weightZ")  # same size, other bytes
    refused = CliRunner().invoke(app, ["weights", "fetch", "tiny"])
    assert isinstance(refused.exception, CLIError)
    assert str(local) in str(refused.exception) and pinned.sha256 in str(refused.exception)
    assert not (store / "weights" / "tiny" / "model.safetensors").exists()


@pytest.mark.parametrize("corrupt", ["same size", "other size", "a folder"])
def test_a_corrupt_staged_file_is_listed_corrupt_and_fetch_replaces_it(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch, corrupt: str):
    """A store-writing node put something else at the pinned file's path. Before, at the pinned size, `weights
    list` said `staged` and `weights fetch` said "already staged", so the operator's tool never replaced it."""
    from typer.testing import CliRunner

    from orchestrator.cli import _register, app

    _register()
    weights, store = tmp_path / "weights", tmp_path / "store"
    local = weights / "tiny" / "model.safetensors"
    local.parent.mkdir(parents=True)
    local.write_bytes(b"pinned tiny weights")
    pinned = PinnedFile(local.name, hashlib.sha256(local.read_bytes()).hexdigest(), local.stat().st_size)
    monkeypatch.setitem(EXTRACTORS, "tiny", replace(EXTRACTORS["dinov2-vit-b-14"], name="tiny", files=(pinned,)))
    monkeypatch.setenv("ABLATE_WEIGHTS_DIR", str(weights))
    monkeypatch.setenv("ABLATE_CHECKPOINT_URL", f"file://{store}")
    staged = store / "weights" / "tiny" / "model.safetensors"
    staged.parent.mkdir(parents=True)
    if corrupt == "a folder":
        (staged / "x").mkdir(parents=True)
    else:
        staged.write_bytes(b"hostile tiny weightZ" if corrupt == "same size" else b"hostile")

    listed = CliRunner().invoke(app, ["weights", "list"], env={"COLUMNS": "400"})
    (row,) = [line for line in listed.output.splitlines() if line.startswith("│ tiny")]
    assert row.rstrip(" │").endswith("corrupt"), row
    fetched = CliRunner().invoke(app, ["weights", "fetch", "tiny"])
    assert fetched.exit_code == 0, fetched.output
    assert "replacing a corrupt file there" in fetched.output and "already staged" not in fetched.output
    assert staged.read_bytes() == b"pinned tiny weights"
    listed = CliRunner().invoke(app, ["weights", "list"], env={"COLUMNS": "400"})
    (row,) = [line for line in listed.output.splitlines() if line.startswith("│ tiny")]
    assert row.rstrip(" │").endswith("staged"), row


def test_a_store_that_cannot_be_written_is_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from typer.testing import CliRunner

    from orchestrator.cli import CLIError, _register, app

    _register()
    local = tmp_path / "weights" / "tiny" / "model.safetensors"
    local.parent.mkdir(parents=True)
    local.write_bytes(b"pinned tiny weights")
    pinned = PinnedFile(local.name, hashlib.sha256(local.read_bytes()).hexdigest(), local.stat().st_size)
    monkeypatch.setitem(EXTRACTORS, "tiny", replace(EXTRACTORS["dinov2-vit-b-14"], name="tiny", files=(pinned,)))
    monkeypatch.setenv("ABLATE_WEIGHTS_DIR", str(tmp_path / "weights"))
    blocker = tmp_path / "store-is-a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("ABLATE_CHECKPOINT_URL", f"file://{blocker}")
    refused = CliRunner().invoke(app, ["weights", "fetch", "tiny"])
    assert isinstance(refused.exception, CLIError), refused.output
    assert "\n" not in str(refused.exception) and f"staging in file://{blocker} failed" in str(refused.exception)
