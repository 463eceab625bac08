"""A command arm's `code` on its way to a joined node: one tar of the directory, named by its content.

The controller packs `code` (its own copy of the directory, as it packs nothing else of its own) into a
deterministic tar: entries in name order, owners and times zeroed, so the same files give the same
bytes and the same SHA-256. The node keeps it as `{remote_dir}/code/<sha256>.tar` (orchestrator/fleet/
code_upload.py) and the worker unpacks it as the command's working directory (worker/command.py). A
directory the controller does not have is left to the node (a rented node's image holds it).

Only what lies under `code` goes, and only while `code`, resolved on the controller, lies under an
ABLATE_COMMAND_DIRS directory: a symlinked `code` must not ship another directory of the controller's
to an untrusted node. Symlinks inside travel as links (their targets are never read here). A file's bytes
are read through descriptors opened one path part at a time from `code` with O_NOFOLLOW, and must be the
regular file of the size listed: a file or folder swapped for a link while packing is refused, not read.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.fleet.node_pool import LOCAL
from worker.stored_file import open_beneath

if TYPE_CHECKING:
    from orchestrator.fleet.node_pool import NodePool
    from orchestrator.settings import Settings

SKIP = frozenset({".git", "__pycache__"})  # what each attempt's copy leaves out (worker/command.py)


class CodeRefused(Exception):
    """The code cannot be shipped (too large, outside the allowed directories): the run's error."""


@dataclass(frozen=True)
class CodeArchive:
    data: bytes
    sha256: str

    @property
    def name(self) -> str:
        return f"{self.sha256}.tar"


def _entries(root: Path) -> list[Path]:
    """Every path under root in name order, without SKIP folders; symlinks are not followed."""
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP)
        base = Path(folder)
        out += [base / d for d in dirs if (base / d).is_symlink()]  # os.walk lists but never enters them
        out += [base / f for f in sorted(files)]
        if base != root:
            out.append(base)
    return sorted(out)


def _read_inside(root_fd: int, rel: Path, size: int) -> bytes:
    """The bytes of regular file `rel` under the directory `root_fd`, no link followed at any part; raises
    CodeRefused when it is not the regular file of `size` bytes it was listed as."""
    fd = None
    try:
        fd = open_beneath(root_fd, rel.parts)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            raise OSError(f"no longer the regular file of {size} bytes it was")
        data = b""
        while len(data) <= size and (chunk := os.read(fd, size + 1 - len(data))):
            data += chunk
    except OSError as exc:
        raise CodeRefused(f"command.code file {rel} changed while it was packed ({exc}): not shipped; "
                          "submit again once the code is still") from None
    finally:
        if fd is not None:
            os.close(fd)
    if len(data) != size:
        raise CodeRefused(f"command.code file {rel} changed size while it was packed: not shipped")
    return data


def pack_code(code: str, allowed: Sequence[Path], max_bytes: int) -> CodeArchive | None:
    """The archive of `code`, or None when the controller has no such directory (the node's image may).
    Raises CodeRefused past max_bytes (ABLATE_COMMAND_MAX_BYTES) or outside `allowed`."""
    root = Path(code)
    if not root.is_dir():
        return None
    real = root.resolve()
    if not any(real.is_relative_to(Path(d).resolve()) for d in allowed):
        raise CodeRefused(f"command.code {code!r} resolves to {real} on the controller, outside ABLATE_COMMAND_DIRS: "
                          "not shipped to the node")
    buf = io.BytesIO()
    total = 0
    root_fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in _entries(real):
                rel = path.relative_to(real)
                info = tar.gettarinfo(str(path), arcname=rel.as_posix())
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                if info.isreg():
                    total += info.size
                    if total > max_bytes:
                        raise CodeRefused(f"command.code {code!r} holds more than ABLATE_COMMAND_MAX_BYTES="
                                          f"{max_bytes} bytes: keep data and checkpoints out of it (the node reads "
                                          "data itself)")  # fmt: skip
                    tar.addfile(info, io.BytesIO(_read_inside(root_fd, rel, info.size)))
                elif info.isdir() or info.issym() or info.islnk():  # a hard link: to an earlier entry
                    tar.addfile(info)
                # sockets, fifos, devices: nothing a trainer's code needs
    finally:
        os.close(root_fd)
    data = buf.getvalue()
    return CodeArchive(data, hashlib.sha256(data).hexdigest())


def ship_code(settings: Settings, pool: NodePool, node: str, spec: dict[str, Any]) -> str | None:
    """Where the worker on `node` finds the run's code archive: None for a built-in arm, for the
    controller's own machine (the code is read in place) and for code the controller does not have
    (the node's image); else the archive's path on the node, uploaded if it is not there yet."""
    command = spec.get("command")
    if not command or node == LOCAL:
        return None
    archive = pack_code(command["code"], settings.command_dirs, settings.command_max_bytes)
    return None if archive is None else pool.upload_code(node, archive.name, archive.data)
