"""Reading a file from checkpoint storage that a node may have written.

A run's prefix is written by whichever node ran it, and a node that can write its prefix may leave
anything there: a symbolic link to the reader's own files (in a `file://` or `sftp://` store shared
with nodes), a link to another run's files, a file of any size. Every read of a stored file, on the
controller (a sample image, the report, a sweep's copy-back) and on a resuming node, goes through here:

- the prefix itself is reached without following a link at any component, from `/` down: a node
  created its run's folder in a store shared with nodes, so it can replace that folder (or a folder
  above it that it can write) with a link to the reader's own files. A store named through a link is
  refused too: name it by its real path;
- the path must lie inside the prefix, and no part of it below the prefix may be a symbolic link: on
  local disk each directory is opened from the one above it (`dir_fd`, O_NOFOLLOW at every level), so a
  node that swaps a parent directory for a link between a check and the open gains nothing; over SFTP
  each component is lstat'ed (see `_open_sftp` for the window that remains);
- the file must be a regular file;
- at most `max_bytes` are read; more is refused, not cut short.

Object stores (s3://, gs://, memory://) have no links; there the path is only checked to stay under
the prefix. Imports nothing of torch.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

CHUNK = 1 << 20


class StoredFileRefused(Exception):
    """A stored file the reader will not read (a link, outside the prefix, not a file, too large).

    The message names the path, for the operator's log; `why` says the same without any path, for a
    client who may not learn where the controller keeps its files."""

    def __init__(self, message: str, why: str = "refused by the controller") -> None:
        super().__init__(message)
        self.why = why


def _protocol(fs: Any) -> str:
    proto = fs.protocol
    return proto if isinstance(proto, str) else proto[0]


def _inside(root: str, path: str) -> bool:
    root = posixpath.normpath(root)
    path = posixpath.normpath(path)
    return path != root and (path.startswith(root.rstrip("/") + "/") or root == "/")


def _parts(root: str, path: str) -> list[str]:
    """The components of `path` below `root` (lexically, nothing resolved); refused when it is not below."""
    if not _inside(root, path):
        raise StoredFileRefused(f"{path} is outside the run's prefix {root}", "outside the run's folder")
    rel = posixpath.relpath(posixpath.normpath(path), posixpath.normpath(root))
    return rel.split("/")


def _link(path: str) -> StoredFileRefused:
    return StoredFileRefused(f"{path} is a symbolic link, or lies under one; stored files are never followed",
                             "a symbolic link, or under one")


def open_beneath(dir_fd: int, parts: Sequence[str]) -> int:
    """A descriptor of the file `parts` below the directory `dir_fd`, each directory opened from the one
    above it and every part with O_NOFOLLOW: no link is followed at any level, whatever is renamed
    meanwhile. Raises OSError: ELOOP where a part is a link, ENOTDIR where a directory part is not one."""
    here = dir_fd
    try:
        for part in parts[:-1]:
            below = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=here)
            if here != dir_fd:
                os.close(here)
            here = below
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=here)
    finally:
        if here != dir_fd:
            os.close(here)


def _prefix_refused(root: str, reached: str, what: str) -> StoredFileRefused:
    why = "the run's folder is a symbolic link, or lies under one" if "link" in what else f"the run's folder is {what}"
    return StoredFileRefused(
        f"the run's stored folder {root} is refused: {reached} is {what}; a stored folder is reached without "
        "following any link, since a node may swap its folder for one (if the store is named through a link, "
        "name it by its real path)", why)


def _prefix_parts(root: str) -> list[str]:
    path = posixpath.normpath(root)
    if not path.startswith("/"):
        raise StoredFileRefused(f"the run's stored folder {root} is not an absolute path", "not an absolute path")
    return [p for p in path.split("/") if p]


def open_prefix(root: str) -> int:
    """A descriptor of the directory `root` on local disk, walked from `/` one component at a time, each
    opened from the one above it with O_NOFOLLOW | O_DIRECTORY: no link is followed at any level, whatever
    is renamed meanwhile. Raises StoredFileRefused where a component is a link or not a directory,
    FileNotFoundError where one is missing."""
    parts = _prefix_parts(root)
    search = getattr(os, "O_PATH", os.O_RDONLY)  # a directory passed through needs search, not read, permission
    here = os.open("/", search | os.O_DIRECTORY)
    for i, part in enumerate(parts):
        flags = (os.O_RDONLY if i == len(parts) - 1 else search) | os.O_DIRECTORY | os.O_NOFOLLOW
        try:
            below = os.open(part, flags, dir_fd=here)
        except OSError as exc:
            reached = "/" + "/".join(parts[: i + 1])
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            raise _prefix_refused(root, reached, "a symbolic link" if os.path.islink(reached)
                                  else "not a directory") from None  # fmt: skip
        finally:
            os.close(here)
        here = below
    return here


def check_prefix(fs: Any, root: str) -> None:
    """Refuse the prefix `root` before listing it: a link at any component, or not a directory (file://
    and sftp://; object stores have no links). Listing is only a preview: each file is opened through a
    fresh walk (open_stored), so a link swapped in after this check is still refused at the read."""
    proto = _protocol(fs)
    if proto in ("file", "local"):
        os.close(open_prefix(root))
    elif proto in ("sftp", "ssh"):
        _check_sftp_prefix(fs.ftp, root)


def _check_sftp_prefix(sftp: Any, root: str, is_dir: bool = True) -> None:
    """The prefix over SFTP: the server's real path of it is the path as named (no component is a link),
    and (`is_dir`) it is a directory. One round trip for the real path; the components are lstat'ed only
    to name the link in a refusal."""
    parts = _prefix_parts(root)
    named = "/" + "/".join(parts)
    if sftp.normalize(named) != named:  # the server resolves every link on the way (realpath)
        walked = ""
        for part in parts:
            walked += "/" + part
            mode = sftp.lstat(walked).st_mode or 0
            if stat.S_ISLNK(mode):
                raise _prefix_refused(root, walked, "a symbolic link")
        # The link was swapped back meanwhile: refused all the same.
        raise _prefix_refused(root, named, "not its own real path (a link on the way)")
    if is_dir and not stat.S_ISDIR(sftp.lstat(named).st_mode or 0):
        raise _prefix_refused(root, named, "not a directory")


def _open_local(root: str, path: str) -> IO[bytes]:
    """`path` opened from the prefix down (open_beneath), the prefix walked from `/` (open_prefix)."""
    parts = _parts(root, path)
    root_fd = open_prefix(root)
    try:
        fd = open_beneath(root_fd, parts)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):  # O_NOFOLLOW's answers (a link as a directory: ENOTDIR)
            raise
        walked = [posixpath.join(root, *parts[: i + 1]) for i in range(len(parts))]
        if any(os.path.islink(p) for p in walked):  # only to say which: the open above already refused it
            raise _link(path) from None
        raise StoredFileRefused(f"{path} lies under something that is not a directory",
                                "under something that is not a directory") from None
    finally:
        os.close(root_fd)
    fh = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        fh.close()
        raise StoredFileRefused(f"{path} is not a regular file", "not a regular file")
    return fh


def _open_sftp(sftp: Any, root: str, path: str) -> IO[bytes]:
    """Open `path` over SFTP after the prefix's check (`_check_sftp_prefix`) and an lstat of every
    component below it refuse links, then do both again once the file is open and check that the open
    file is the one walked to (size, time and owner). SFTP has no openat and no O_NOFOLLOW, so a window
    remains: a node that swaps a parent (or its run's folder) for a link after the first walk and back
    before the second, to a file of the same size, time and owner, could have the open follow it. The
    second walk makes that take two well-timed renames instead of one."""
    parts = _parts(root, path)

    def walk() -> Any:  # noqa: ANN401 - paramiko's SFTPAttributes of the file
        _check_sftp_prefix(sftp, root, is_dir=False)  # a directory: the lstat of a path below it says so
        walked, attrs = root.rstrip("/") or "/", None
        for i, part in enumerate(parts):
            walked = posixpath.join(walked, part)
            attrs = sftp.lstat(walked)
            mode = attrs.st_mode or 0
            if stat.S_ISLNK(mode):
                raise _link(walked)
            if i < len(parts) - 1 and not stat.S_ISDIR(mode):
                raise StoredFileRefused(f"{walked} is not a directory", "under something that is not a directory")
            if i == len(parts) - 1 and not stat.S_ISREG(mode):
                raise StoredFileRefused(f"{path} is not a regular file", "not a regular file")
        return attrs

    walk()
    fh = sftp.open(path, "rb")
    try:
        walked, opened = walk(), fh.stat()
        if any(getattr(walked, a) != getattr(opened, a) for a in ("st_size", "st_mtime", "st_uid")):
            raise _link(path)  # the open reached another file than the walk: through a link swapped in
    except BaseException:
        fh.close()
        raise
    return fh


def open_stored(fs: Any, root: str, path: str) -> IO[bytes]:
    """`path` under the prefix `root` of `fs`, opened for reading; raises StoredFileRefused with the reason."""
    proto = _protocol(fs)
    if proto in ("file", "local"):
        return _open_local(root, path)
    if proto in ("sftp", "ssh"):
        return _open_sftp(fs.ftp, root, path)  # paramiko's SFTPClient
    if not _inside(root.strip("/"), path.strip("/")):
        raise StoredFileRefused(f"{path} is outside the run's prefix {root}", "outside the run's folder")
    return fs.open(path, "rb")


def read_stored(fs: Any, root: str, path: str, max_bytes: int) -> bytes:
    """The bytes of a stored file of at most `max_bytes`; a larger one is refused."""
    with open_stored(fs, root, path) as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise StoredFileRefused(f"{path} is over {max_bytes} bytes, the most read of such a file",
                               f"over {max_bytes} bytes")
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
                    raise StoredFileRefused(f"{path} is over {max_bytes} bytes, the most copied",
                                            f"over {max_bytes} bytes")
                out.write(chunk)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, dest)
    return size

