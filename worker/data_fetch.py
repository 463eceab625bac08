"""data.url: prepared shards (`ablate data prepare`) on durable storage, fetched once per node.

A rented node starts with an empty disk. The first arm of a node to start takes a lock file in the
node's data cache, downloads the manifest and every shard it lacks, and verifies each against the
manifest's sha256; the node's other arms wait on the lock and find the copy complete (no download).
The arms then read the one cached copy memory-mapped, sharing it through the page cache.

Cache layout: <cache_dir>/<name>-<sha of the URL>/ holds the prepared directory as `prepare` wrote it;
<name>-<sha>.lock beside it is the lock (flock: released by the kernel if the holder dies, so a killed
fetch never blocks the node). Shards land under a temporary name and are renamed when complete; the
manifest is written last, so a copy with a manifest is one whose files were all verified. Every fetch
hashes every file, cached or not, so a file changed on the node's disk since its fetch never trains.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from model.data.base import DatasetError
from model.data.prepared import MANIFEST, bad_files, checked_files, parse_manifest, pinned
from worker.checkpoint_store import open_fs

# The default cache of a node; the controller passes <home_dir>/data-cache (the same disk as out_dir).
DEFAULT_CACHE = Path("~/.cache/ablate/data")
SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")  # a manifest names files, never paths


@dataclass(frozen=True)
class DataStore:
    """How a worker reaches data.url: fsspec storage options (those of checkpoint storage unless the
    operator sets ABLATE_DATA_OPTIONS) and the node's cache directory. Built by the controller
    (orchestrator/runs/storage.py worker_data_store), handed to the worker as a dict."""

    options: dict[str, Any] = field(default_factory=dict)
    cache_dir: str = str(DEFAULT_CACHE)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> DataStore:
        return cls(**(d or {}))


@dataclass
class Fetched:
    """What one arm's fetch did; recorded on its checkpoints (`data_fetch`)."""

    url: str
    path: str  # the local prepared directory the arm trains from
    downloaded: list[str]  # files this arm downloaded; [] when the node's copy was complete
    bytes: int
    seconds: float  # downloading and verifying, after the lock was taken
    lock_wait_s: float  # waiting for another arm of the node that held the lock

    def as_record(self) -> dict[str, Any]:
        return asdict(self)


def cache_path(cache_dir: Path, url: str) -> Path:
    """The local directory of `url` in a node's cache: readable name, unique by the URL's hash."""
    tail = re.sub(r"[^A-Za-z0-9_.-]", "_", url.rstrip("/").rsplit("/", 1)[-1])[:40] or "data"
    return cache_dir / f"{tail}-{hashlib.sha256(url.encode()).hexdigest()[:12]}"


def _download(fs: Any, remote: str, local: Path) -> int:
    tmp = local.with_name(local.name + ".fetching")
    fs.get_file(remote, str(tmp))
    tmp.replace(local)
    return local.stat().st_size


def _names(manifest: dict[str, Any], where: str) -> list[str]:
    names = [f["file"] for f in checked_files(manifest)]
    bad = [n for n in names if not SAFE_NAME.match(n)]
    if bad:
        raise DatasetError(f"data.url: {where} names {bad[0]!r}, not a plain file name; re-run ablate data prepare")
    return names


def fetch_prepared(url: str, store: DataStore, pin: str | None = None) -> Fetched:
    """The local copy of the prepared directory at `url`, complete and verified; downloads what is missing.

    Every file the manifest lists (shards, captions, embeddings) is hashed, cached or not. Raises
    DatasetError naming the file when the store lacks one, and naming it when a downloaded file does not
    match the manifest's checksum (the store holds a corrupt or partly uploaded copy). A cached file that
    no longer matches (changed on the node's disk) is downloaded again. pin: the manifest's sha256 the
    run started on; a store whose manifest differs is refused before anything is downloaded.
    """
    cache = Path(store.cache_dir).expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    dest = cache_path(cache, url)
    t0 = time.monotonic()
    with open(dest.with_name(dest.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the node's other arms wait here while one fetches
        waited = time.monotonic() - t0
        t1 = time.monotonic()
        fs, root = open_fs(url, store.options)
        root = root.rstrip("/")
        where = f"{url.rstrip('/')}/{MANIFEST}"
        try:
            raw = fs.cat_file(f"{root}/{MANIFEST}")
        except FileNotFoundError:
            raise DatasetError(
                f"data.url: {where} does not exist; upload a directory made by `ablate data prepare` there"
            ) from None
        pinned(hashlib.sha256(raw).hexdigest(), pin, where)
        text = raw.decode()
        manifest = parse_manifest(text, where)
        _names(manifest, where)
        dest.mkdir(exist_ok=True)
        local_manifest = dest / MANIFEST
        same = local_manifest.is_file() and local_manifest.read_text() == text
        if not same:
            local_manifest.unlink(missing_ok=True)  # incomplete until every file is verified again
        # Files already here that match the new manifest's checksums are kept, whatever manifest they came with.
        downloaded = bad_files(dest, manifest)
        size = sum(_fetch_one(fs, root, name, dest, url) for name in downloaded)
        corrupt = bad_files(dest, manifest, names=set(downloaded)) if downloaded else []
        if corrupt:
            for name in corrupt:
                (dest / name).unlink(missing_ok=True)
            raise DatasetError(
                f"data.url: {corrupt[0]} fetched from {url.rstrip('/')}/{corrupt[0]} does not match its checksum "
                f"in {where} (corrupt or partly uploaded); run ablate data prepare again and upload the directory"
            )
        if not same:
            tmp = dest / (MANIFEST + ".fetching")
            tmp.write_text(text)
            os.replace(tmp, local_manifest)
        return Fetched(url, str(dest), downloaded, size, round(time.monotonic() - t1, 3), round(waited, 3))


def _fetch_one(fs: Any, root: str, name: str, dest: Path, url: str) -> int:
    try:
        return _download(fs, f"{root}/{name}", dest / name)
    except FileNotFoundError:
        raise DatasetError(
            f"data.url: {url.rstrip('/')}/{name} is missing (its manifest lists it); upload the whole directory "
            "that ablate data prepare wrote"
        ) from None
