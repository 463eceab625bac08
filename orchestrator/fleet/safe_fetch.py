"""Safe fetch: a node's files onto the controller over SFTP, trusting nothing the node says.

The node is someone else's computer: names that are not one plain path part are refused, symbolic links
are not followed, and nothing is written outside the target directory.
"""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from orchestrator.fleet.errors import NodeError

if TYPE_CHECKING:
    import paramiko

    from orchestrator.fleet.shell import NodeShell


def fetch_tree(shell: NodeShell, remote: str, local: Path, skipped: list[str] | None = None,
               max_bytes: int | None = None) -> list[Path]:  # fmt: skip
    """Copy a remote file or directory tree to `local` over SFTP; returns the files written. Past
    `max_bytes` in all (counted as read, not as the node lists them) it stops with a NodeError.

    The node is not trusted: nothing is written outside `local`. Names the server lists that are
    not a single plain path part (`..`, `.`, with a `/`, NUL, empty) are refused, and symbolic
    links are not followed (one to `/` would copy the node's filesystem); both are appended to
    `skipped` and named in the node event.
    """
    written: list[Path] = []
    links: list[str] = []
    refused: list[str] = []
    root = local.resolve()
    size = 0
    with shell.client.open_sftp() as sftp:
        for rel, kind in _walk(sftp, remote, refused=refused):
            target = local.joinpath(*PurePosixPath(rel).parts) if rel else local
            if kind == "link":
                links.append(str(PurePosixPath(remote) / rel) if rel else remote)
                continue
            if not target.resolve().is_relative_to(root):  # e.g. a local link planted earlier
                refused.append(f"{PurePosixPath(remote) / rel} (would land outside {local})")
                continue
            if kind == "dir":
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            size += _get(sftp, str(PurePosixPath(remote) / rel) if rel else remote, target,
                         None if max_bytes is None else max_bytes - size)  # fmt: skip
            written.append(target)
    if skipped is not None:
        skipped.extend(links + refused)
    note = f"; skipped {len(links)} symbolic links: {', '.join(links)}" if links else ""
    note += f"; refused {len(refused)} unsafe names: {', '.join(refused)}" if refused else ""
    shell.note("sftp.get", f"{remote} -> {local} ({len(written)} files{note})")
    return written


def _get(sftp: paramiko.SFTPClient, remote: str, target: Path, max_bytes: int | None) -> int:
    """One file, its bytes counted as they arrive; over `max_bytes` the partial file is removed."""
    size = 0
    try:
        listed = sftp.lstat(remote).st_size  # the node's word: used only to pipeline the reads
        with sftp.open(remote, "rb") as src, target.open("wb") as out:
            src.prefetch(min(listed or 0, max_bytes + 1) if max_bytes is not None else listed)
            while chunk := src.read(1 << 20):
                size += len(chunk)
                if max_bytes is not None and size > max_bytes:
                    raise NodeError(f"copying {remote} stopped: the copy is over its cap of bytes "
                                    "(ABLATE_COPY_BACK_MAX_BYTES per run)")
                out.write(chunk)
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return size


def _safe_name(name: str) -> bool:
    """One plain path part: what a directory listing may hold (a hostile server may send anything)."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and "\x00" not in name


def _walk(
    sftp: paramiko.SFTPClient, root: str, rel: str = "", refused: list[str] | None = None
) -> Iterator[tuple[str, str]]:
    """(relative path, "dir" | "file" | "link") under root, depth first; links are not followed and
    unsafe names are appended to `refused` instead of being walked."""
    path = str(PurePosixPath(root) / rel) if rel else root
    try:
        attrs = sftp.lstat(path)
    except FileNotFoundError:
        raise NodeError(f"remote path {path} does not exist") from None
    mode = attrs.st_mode or 0
    if stat.S_ISLNK(mode):
        yield rel, "link"
    elif stat.S_ISDIR(mode):
        yield rel, "dir"
        for entry in sorted(sftp.listdir_attr(path), key=lambda a: a.filename):
            if not _safe_name(entry.filename):
                if refused is not None:
                    refused.append(f"{path}/{entry.filename!r} (unsafe name)")
                continue
            child = str(PurePosixPath(rel) / entry.filename) if rel else entry.filename
            yield from _walk(sftp, root, child, refused)
    else:
        yield rel, "file"
