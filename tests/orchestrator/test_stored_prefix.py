"""A run's own folder in a store shared with nodes, swapped by the node for a symbolic link: the node
created that folder, so it may replace it (or, where it can write there, a folder above it) with a link
to the reader's files. The controller's copy-back, its sample reads and a resuming node's restore each
refuse the folder and copy nothing, on a `file://` store and on a real OpenSSH server's `sftp://` store.

The victims stand in for what a reader holds: the controller's `~/.ssh` (the key it rents nodes with)
and another run's folder on the resuming node's shared disk."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from orchestrator.db.models import Run
from orchestrator.results.samples import sample_png
from orchestrator.runs.storage import download_run
from worker.checkpoint_store import CheckpointStore, StoreConfig
from worker.folder_mirror import FolderMirror
from worker.run_files import COMMAND_CHECKPOINTS, sample_dir
from worker.stored_file import StoredFileRefused

KEY = b"-----BEGIN OPENSSH PRIVATE KEY----- the controller's key\n"
OTHER_RUN = b"w" * 98_304  # another run's checkpoint


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (30, 200, 30)).save(out, format="PNG")
    return out.getvalue()


def victim(folder: Path) -> Path:
    """A folder laid out like a run's (so every reader finds what it looks for), holding the reader's secrets."""
    (folder / sample_dir(10)).mkdir(parents=True)
    (folder / sample_dir(10) / "target_0.png").write_bytes(png())
    (folder / "ckpt_0000030.pt").write_bytes(OTHER_RUN)
    (folder / "records.jsonl").write_bytes(b'{"step": 30}\n')
    (folder / "id_ed25519").write_bytes(KEY)
    (folder / COMMAND_CHECKPOINTS.split("/", 1)[0] / "checkpoints").mkdir(parents=True)
    (folder / COMMAND_CHECKPOINTS / "state.bin").write_bytes(OTHER_RUN)
    return folder


def swapped_run_folder(base: Path) -> tuple[Path, Path]:
    """(the store, the run's folder in it), that folder a link to the controller's ~/.ssh."""
    target = victim(base / "controller" / ".ssh")
    store = base / "store"
    store.mkdir()
    (store / "run-1").symlink_to(target, target_is_directory=True)
    return store, store / "run-1"


def swapped_intermediate(base: Path) -> tuple[Path, Path]:
    """(the store, a run's folder two levels below it), the level between a link to a folder elsewhere
    that holds a `run-1` of the victim's files."""
    elsewhere = base / "controller" / "runs"
    victim(elsewhere / "run-1")
    store = base / "store"
    store.mkdir()
    (store / "team").symlink_to(elsewhere, target_is_directory=True)
    return store, store / "team" / "run-1"


LAYOUTS = {"the run's folder": swapped_run_folder, "a folder above it": swapped_intermediate}


def assert_nothing_copied(local: Path) -> None:
    found = [p for p in local.rglob("*") if p.is_file()] if local.exists() else []
    assert not found, f"the copy-back took {found}"


def assert_restore_refused(url: str, options: dict[str, Any], node: Path, command_arm: bool) -> None:
    node.mkdir()
    store = CheckpointStore(StoreConfig(url=url, options=options), node)
    if command_arm:
        store.mirror = FolderMirror(node, COMMAND_CHECKPOINTS)
    with pytest.raises(StoredFileRefused, match="symbolic link"):
        store.fetch_latest_retrying(timeout=600)  # a refusal is not retried: the link stays until removed
    (failed,) = store.status()["log"]
    assert failed["kind"] == "checkpoint.fetch_failed" and "giving up" in failed["message"], failed
    assert_nothing_copied(node)


def sample_of(url: str) -> Run:
    return Run(id=1, arm="A", checkpoint_url=url, checkpoint_dir=None)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_file_store_s_run_folder_that_is_a_link_is_refused_by_every_reader(tmp_path: Path, layout: str) -> None:
    _, prefix = LAYOUTS[layout](tmp_path)
    url = f"file://{prefix}"

    local = tmp_path / "copied-back"
    with pytest.raises(StoredFileRefused, match="symbolic link") as refused:
        download_run(url, {}, local, 1 << 30, [])
    assert "real path" in str(refused.value), "the refusal says how to name a store kept behind a link"
    assert_nothing_copied(local)

    with pytest.raises(StoredFileRefused, match="symbolic link") as refused:
        sample_png(sample_of(url), 10, "target_0.png", {})
    assert "/" not in refused.value.why, "what a client is told names no path"

    for command_arm in (False, True):
        assert_restore_refused(url, {}, tmp_path / f"node-{command_arm}", command_arm)


def test_a_file_store_s_own_run_folder_is_still_read(tmp_path: Path) -> None:
    """The same folder as a real directory: all three readers take it (the refusals above are the link's)."""
    prefix = victim(tmp_path / "store" / "run-1")
    url = f"file://{prefix}"
    local = tmp_path / "copied-back"
    download_run(url, {}, local, 1 << 30, [])
    assert (local / "ckpt_0000030.pt").read_bytes() == OTHER_RUN
    assert (local / COMMAND_CHECKPOINTS / "state.bin").read_bytes() == OTHER_RUN
    assert sample_png(sample_of(url), 10, "target_0.png", {}) == png()
    node = tmp_path / "node"
    node.mkdir()
    store = CheckpointStore(StoreConfig(url=url), node)
    store.mirror = FolderMirror(node, COMMAND_CHECKPOINTS)
    assert store.fetch_latest()["step"] == 30  # type: ignore[index]
    assert (node / COMMAND_CHECKPOINTS / "state.bin").read_bytes() == OTHER_RUN


def test_a_run_folder_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "run-1").write_bytes(KEY)
    with pytest.raises(StoredFileRefused, match="not a directory"):
        download_run(f"file://{tmp_path / 'store' / 'run-1'}", {}, tmp_path / "copied-back", 1 << 30, [])


# -- SFTP: a real OpenSSH server on loopback -----------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_sftp_store_s_run_folder_that_is_a_link_is_refused_by_every_reader(sshd, tmp_path, layout) -> None:  # noqa: ANN001
    base = sshd.workdir / f"prefix-{list(LAYOUTS).index(layout)}"
    base.mkdir()
    _, prefix = LAYOUTS[layout](base)
    url = f"sftp://{sshd.user}@{sshd.host}:{sshd.port}{prefix}"
    options = {"key_filename": str(sshd.client_key), "known_hosts": str(sshd.known_hosts)}

    local = tmp_path / "copied-back"
    with pytest.raises(StoredFileRefused, match="symbolic link"):
        download_run(url, options, local, 1 << 30, [])
    assert_nothing_copied(local)

    with pytest.raises(StoredFileRefused, match="symbolic link"):
        sample_png(sample_of(url), 10, "target_0.png", options)

    for command_arm in (False, True):
        assert_restore_refused(url, options, tmp_path / f"node-{command_arm}", command_arm)

    own = victim(base / "store" / "run-2")  # a real folder beside it is read as before
    own_url = f"sftp://{sshd.user}@{sshd.host}:{sshd.port}{own}"
    download_run(own_url, options, tmp_path / "own", 1 << 30, [])
    assert (tmp_path / "own" / "ckpt_0000030.pt").read_bytes() == OTHER_RUN
    assert sample_png(sample_of(own_url), 10, "target_0.png", options) == png()
