"""Packing a command arm's code for a joined node: the same files give the same archive (a node reuses
it), only `code` goes (never what a symlinked `code` points to outside ABLATE_COMMAND_DIRS), and code past
ABLATE_COMMAND_MAX_BYTES is refused with the setting named."""

from __future__ import annotations

import io
import os
import tarfile
import time
from pathlib import Path

import pytest

from orchestrator.runs.command_code import CodeRefused, pack_code


def names(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.getnames()


def test_the_same_files_pack_to_the_same_archive_without_git_or_caches(tmp_path: Path) -> None:
    code = tmp_path / "code"
    (code / "pkg" / "__pycache__").mkdir(parents=True)
    (code / ".git").mkdir()
    (code / "train.py").write_text("print('hi')")
    (code / "pkg" / "model.py").write_text("x = 1")
    (code / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    (code / ".git" / "HEAD").write_text("ref: main")
    (code / "data").symlink_to("/datasets/shapes")  # a link to the node's data travels as a link
    first = pack_code(str(code), [tmp_path], 1 << 20)
    assert first is not None
    assert sorted(names(first.data)) == ["data", "pkg", "pkg/model.py", "train.py"]
    time.sleep(0.01)
    os.utime(code / "train.py")  # touched, unchanged: the node's copy is reused
    again = pack_code(str(code), [tmp_path], 1 << 20)
    assert again is not None and again.sha256 == first.sha256 and again.name == f"{first.sha256}.tar"
    (code / "train.py").write_text("print('changed')")
    changed = pack_code(str(code), [tmp_path], 1 << 20)
    assert changed is not None and changed.sha256 != first.sha256


def test_code_over_the_limit_or_outside_the_allowed_directories_is_refused(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    (allowed / "big").mkdir(parents=True)
    (allowed / "big" / "weights.bin").write_bytes(b"\0" * 2048)
    with pytest.raises(CodeRefused, match="ABLATE_COMMAND_MAX_BYTES=1024"):
        pack_code(str(allowed / "big"), [allowed], 1024)
    secrets = tmp_path / "controller-secrets"
    secrets.mkdir()
    (secrets / "token").write_text("never to a node")
    (allowed / "sneaky").symlink_to(secrets)
    with pytest.raises(CodeRefused, match="outside ABLATE_COMMAND_DIRS"):
        pack_code(str(allowed / "sneaky"), [allowed], 1 << 20)
    assert pack_code(str(allowed / "only-in-the-image"), [allowed], 1 << 20) is None


@pytest.mark.parametrize("swapped", ["pkg/model.py", "pkg"])
def test_a_file_or_folder_swapped_for_a_link_while_packing_is_refused_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swapped: str
) -> None:
    """The race of a file (or its folder) replaced by a link to the controller's secrets between the
    moment it is listed and the moment it is read: here the swap happens right after tarfile lists it."""
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "pkg" / "model.py").write_text("x = 1  # same size as the secret!")
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    secret = b"controller-api-token-0123456789ab"  # as long as model.py: a size check alone would pass
    assert len(secret) == len((code / "pkg" / "model.py").read_bytes())
    (secrets / "model.py").write_bytes(secret)
    listed = tarfile.TarFile.gettarinfo

    def list_then_swap(self: tarfile.TarFile, name: str, arcname: str, fileobj: object = None) -> tarfile.TarInfo:
        info = listed(self, name, arcname, fileobj)
        if arcname == "pkg/model.py":
            victim = code / swapped
            if victim.is_dir():
                victim.rename(tmp_path / "moved-away")
                victim.symlink_to(secrets, target_is_directory=True)
            else:
                victim.unlink()
                victim.symlink_to(secrets / "model.py")
        return info

    monkeypatch.setattr(tarfile.TarFile, "gettarinfo", list_then_swap)
    with pytest.raises(CodeRefused, match="changed while it was packed"):
        pack_code(str(code), [tmp_path], 1 << 20)
