"""A folder of the run directory kept in checkpoint storage as it is on the node: a command arm's
`checkpoints/` (ABLATE_RUN_DIR/checkpoints), whatever files its script keeps there.

The checkpoint store (worker/checkpoint_store.py) syncs it in each upload cycle, before the checkpoint
it stores: files new or changed since the last sync (size, mtime, inode) are uploaded, files the script
deleted are deleted in storage too; files written after that checkpoint wait for the next cycle. A file
that the same cycle stores under ablate's own name (the checkpoint a metrics line named, hard-linked as
ckpt_*.pt / best.pt) is skipped in that cycle: its bytes are on their way already. A resume fetches the
folder back before anything else.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from worker.stored_file import StoredFileRefused, check_prefix, get_stored

PARTIAL = (".tmp", ".partial", ".fetch")  # a file being written under a temporary name: next cycle


class FolderMirror:
    """`out_dir/rel` (e.g. "run/checkpoints") mirrored at `{root}/rel` in storage."""

    def __init__(self, out_dir: Path, rel: str) -> None:
        self.local = Path(out_dir) / rel
        self.rel = rel
        self._sent: dict[str, tuple[int, int, int]] = {}  # file -> (size, mtime_ns, inode) as uploaded

    def _files(self) -> dict[str, os.stat_result]:
        out = {}
        if self.local.is_dir():
            for path in self.local.rglob("*"):
                if path.is_file() and not path.is_symlink() and not path.name.endswith(PARTIAL):
                    out[path.relative_to(self.local).as_posix()] = path.stat()
        return out

    def sync(self, fs: Any, root: str, put_file: Callable[[Path, str], None], skip_inodes: set[int],
             up_to_ns: int) -> int:  # fmt: skip
        """Upload what changed, delete what the script deleted; returns the bytes sent. Files written after
        `up_to_ns` (the stored checkpoint's time) wait for a later cycle: a restored folder is never newer
        than the records stored with its checkpoint, so a resumed script repeats no step unrecorded."""
        remote = f"{root}/{self.rel}"
        size = 0
        files = self._files()
        for name, st in sorted(files.items()):
            signature = (st.st_size, st.st_mtime_ns, st.st_ino)
            if st.st_ino in skip_inodes or st.st_mtime_ns > up_to_ns or self._sent.get(name) == signature:
                continue
            put_file(self.local / name, f"{remote}/{name}")  # a copy: the script may rewrite its file
            self._sent[name] = signature
            size += st.st_size
        for name in [n for n in self._sent if n not in files]:
            try:
                fs.rm_file(f"{remote}/{name}")
            except FileNotFoundError:
                pass
            del self._sent[name]
        return size

    def fetch(self, fs: Any, root: str, max_bytes: int | None = None, skipped: list[str] | None = None) -> int:
        """The stored folder into out_dir (names outside it refused); returns the bytes fetched. Files are
        read as worker/stored_file.py allows (no links, inside the prefix, `max_bytes` in all); a refused
        one raises StoredFileRefused, or is named in `skipped` when a list is given. A run's folder that is
        a link, or lies under one, raises StoredFileRefused before anything is listed."""
        remote = f"{root}/{self.rel}"
        try:
            check_prefix(fs, root)  # a listing follows links: the run's folder is checked first
            found = fs.find(remote, detail=True)
        except FileNotFoundError:
            return 0
        prefix = remote.strip("/") + "/"
        size = 0
        for path, info in found.items():
            rel = PurePosixPath(path.lstrip("/").removeprefix(prefix))
            if info.get("type") != "file" or rel.is_absolute() or ".." in rel.parts or not rel.parts:
                continue
            dest = self.local / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            left = None if max_bytes is None else max_bytes - size
            try:
                get_stored(fs, root, path, dest, left)
            except StoredFileRefused as exc:
                if skipped is None:
                    raise
                skipped.append(str(exc))
                continue
            st = dest.stat()
            self._sent[rel.as_posix()] = (st.st_size, st.st_mtime_ns, st.st_ino)  # stored: not sent again
            size += st.st_size
        return size
