"""A command arm's `code` on its way to a joined node: one tar of the directory, named by its content.

The controller packs `code` (its own copy of the directory, as it packs nothing else of its own) into a
deterministic tar: entries in name order, owners and times zeroed, so the same files give the same
bytes and the same SHA-256. The node keeps it as `{remote_dir}/code/<sha256>.tar` (orchestrator/fleet/
code_upload.py) and the worker unpacks it as the command's working directory (worker/command.py). A
directory the controller does not have is left to the node (a rented node's image holds it).

Only what lies under `code` goes, and only while `code`, resolved on the controller, lies under an
ABLATE_COMMAND_DIRS directory: a symlinked `code` must not ship another directory of the controller's
to an untrusted node. Symlinks inside travel as links (their targets are never read here).
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.fleet.node_pool import LOCAL

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
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in _entries(real):
            info = tar.gettarinfo(str(path), arcname=path.relative_to(real).as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if info.isreg():
                total += info.size
                if total > max_bytes:
                    raise CodeRefused(f"command.code {code!r} holds more than ABLATE_COMMAND_MAX_BYTES={max_bytes} "
                                      "bytes: keep data and checkpoints out of it (the node reads data itself)")
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            elif info.isdir() or info.issym() or info.islnk():  # a hard link: to an earlier entry
                tar.addfile(info)
            # sockets, fifos, devices: nothing a trainer's code needs
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
