"""Reading a file from checkpoint storage that a node may have written.

A run's prefix is written by whichever node ran it, and a node that can write its prefix may leave
anything there: a symbolic link to the reader's own files (in a `file://` or `sftp://` store shared
with nodes), a link to another run's files, a file of any size. Every read of a stored file, on the
controller (a sample image, the report, a sweep's copy-back) and on a resuming node, goes through here:

- the file must be a regular file, not a symbolic link (O_NOFOLLOW on local disk, lstat over SFTP);
- its real path must lie inside the prefix (links in the directories above it are resolved and checked);
- at most `max_bytes` are read; more is refused, not cut short.

Object stores (s3://, gs://, memory://) have no links; there the path is only checked to stay under
the prefix. Imports nothing of torch.
"""

from __future__ import annotations

import os
import posixpath
import stat
from pathlib import Path
from typing import IO, Any

CHUNK = 1 << 20


class StoredFileRefused(Exception):
    """A stored file the reader will not read (a link, outside the prefix, not a file, too large)."""


def _protocol(fs: Any) -> str:
    proto = fs.protocol
    return proto if isinstance(proto, str) else proto[0]


def _inside(root: str, path: str) -> bool:
    root = posixpath.normpath(root)
    path = posixpath.normpath(path)
    return path != root and (path.startswith(root.rstrip("/") + "/") or root == "/")


def open_stored(fs: Any, root: str, path: str) -> IO[bytes]:
    """`path` under the prefix `root` of `fs`, opened for reading; raises StoredFileRefused with the reason."""
    proto = _protocol(fs)
    if proto in ("file", "local"):
        if os.path.islink(path):
            raise StoredFileRefused(f"{path} is a symbolic link; stored files are never followed")
        real_root, real = os.path.realpath(root), os.path.realpath(path)
        if not _inside(real_root, real):
            raise StoredFileRefused(f"{path} resolves to {real}, outside the run's prefix {root}")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            if os.path.islink(path):  # O_NOFOLLOW's ELOOP: a link swapped in since the check
                raise StoredFileRefused(f"{path} is a symbolic link; stored files are never followed") from None
            raise
        fh = os.fdopen(fd, "rb")
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            fh.close()
            raise StoredFileRefused(f"{path} is not a regular file")
        return fh
    if proto in ("sftp", "ssh"):
        sftp = fs.ftp  # paramiko's SFTPClient: lstat and the server's realpath
        mode = sftp.lstat(path).st_mode or 0
        if stat.S_ISLNK(mode):
            raise StoredFileRefused(f"{path} is a symbolic link; stored files are never followed")
        if not stat.S_ISREG(mode):
            raise StoredFileRefused(f"{path} is not a regular file")
        real, real_root = sftp.normalize(path), sftp.normalize(root)
        if not _inside(real_root, real):
            raise StoredFileRefused(f"{path} resolves to {real}, outside the run's prefix {root}")
        return sftp.open(path, "rb")
    if not _inside(root.strip("/"), path.strip("/")):
        raise StoredFileRefused(f"{path} is outside the run's prefix {root}")
    return fs.open(path, "rb")


def read_stored(fs: Any, root: str, path: str, max_bytes: int) -> bytes:
    """The bytes of a stored file of at most `max_bytes`; a larger one is refused."""
    with open_stored(fs, root, path) as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise StoredFileRefused(f"{path} is over {max_bytes} bytes, the most read of such a file")
    return data


def get_stored(fs: Any, root: str, path: str, dest: Path, max_bytes: int | None = None) -> int:
    """Copy a stored file to `dest` (through `dest`.fetch, replaced at the end); returns its size. A file
    over `max_bytes` is refused and nothing is left behind."""
    tmp = dest.with_name(dest.name + ".fetch")
    size = 0
    try:
        with open_stored(fs, root, path) as src, tmp.open("wb") as out:
            while chunk := src.read(CHUNK):
                size += len(chunk)
                if max_bytes is not None and size > max_bytes:
                    raise StoredFileRefused(f"{path} is over {max_bytes} bytes, the most copied")
                out.write(chunk)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, dest)
    return size

