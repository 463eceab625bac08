"""Reading a stored file a node may have written (worker/stored_file.py): every directory below the prefix
is opened from the one above it without following links, so no parent directory can be a link, whether
it was one before the read or was swapped in during it. Real files on local disk; over SFTP the same
rule is checked against a real OpenSSH server in tests/orchestrator/test_hostile_storage.py."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest

from worker.stored_file import StoredFileRefused, read_stored

SECRET = b"the reading node's credential"


@pytest.fixture
def prefix(tmp_path: Path) -> Path:
    root = tmp_path / "store" / "run-1"
    (root / "samples" / "step_10").mkdir(parents=True)
    (root / "samples" / "step_10" / "recon_0.png").write_bytes(b"png")
    return root


def read(root: Path, rel: str) -> bytes:
    return read_stored(fsspec.filesystem("file"), str(root), f"{root}/{rel}", 1 << 20)


def test_a_file_below_the_prefix_is_read(prefix: Path) -> None:
    assert read(prefix, "samples/step_10/recon_0.png") == b"png"


def test_a_parent_directory_that_is_a_link_is_refused_even_into_the_prefix(prefix: Path) -> None:
    """The link points inside the prefix, so resolving it and checking where it lands passes: only
    refusing every link on the way down stops a node that swaps a parent for a link mid-read."""
    (prefix / "samples" / "step_20").symlink_to(prefix / "samples" / "step_10", target_is_directory=True)
    with pytest.raises(StoredFileRefused, match="symbolic link"):
        read(prefix, "samples/step_20/recon_0.png")


def test_a_parent_directory_that_links_out_of_the_prefix_is_refused(prefix: Path, tmp_path: Path) -> None:
    outside = tmp_path / "home" / "step_30"
    outside.mkdir(parents=True)
    (outside / "recon_0.png").write_bytes(SECRET)
    (prefix / "samples" / "step_30").symlink_to(outside, target_is_directory=True)
    with pytest.raises(StoredFileRefused, match="symbolic link"):
        read(prefix, "samples/step_30/recon_0.png")


def test_a_link_as_the_file_and_a_path_out_of_the_prefix_are_refused(prefix: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    (prefix / "samples" / "step_10" / "recon_1.png").symlink_to(secret)
    with pytest.raises(StoredFileRefused, match="symbolic link"):
        read(prefix, "samples/step_10/recon_1.png")
    with pytest.raises(StoredFileRefused, match="outside"):
        read(prefix, "../../secret")
