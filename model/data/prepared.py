"""Prepared shards: a source decoded once at the training resolution (`ablate data prepare`), read
memory-mapped, so the arms of one node share one copy through the page cache and no arm decodes.

Layout of a prepared directory:
  manifest.json      {"format", "resolution", "count", "shards": [{"file", "count", "bytes", "sha256"}],
                      "captions": {"file", "bytes", "sha256"}, "embeddings": {the same} | null,
                      "source", "skipped": [unreadable inputs]}
  shard-00000.npy    uint8 (n, 3, R, R), numpy's .npy format (np.load(mmap_mode="r") maps it)
  captions.jsonl     one {"caption", optional "edit"} per image, in shard order
  embeddings.pt      optional: caption -> (tokens, dim) float32, copied from the source
Every file is hashed at start and one that does not match fails naming it (verify_files); its names
must stay inside the directory. A run pins the manifest's sha256 (`manifest_sha256`): its resume, or
another node, refuses a directory whose manifest differs.
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from model.data.base import DatasetError, PixelRange, resolve_inside
from model.data.captioned import CaptionedDataset, Entry

FORMAT = "ablate-prepared/2"  # /2: captions and embeddings carry a checksum too
MANIFEST = "manifest.json"
CAPTIONS = "captions.jsonl"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def parse_manifest(text: str, where: str | Path) -> dict:
    """A manifest's JSON, checked for the format `prepare` writes; `where` names it in errors."""
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"prepared: {where} is not valid JSON ({exc.msg})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise DatasetError(
            f"prepared: {where} has format {found!r}, expected {FORMAT!r}; run ablate data prepare again "
            "with the same --out (it keeps the shards it finished and writes a new manifest)"
        )
    for i, f in enumerate(checked_files(manifest)):
        if not (isinstance(f, dict) and isinstance(f.get("file"), str) and isinstance(f.get("bytes"), int)):
            raise DatasetError(f"prepared: {where}: file entry {i} needs a file name, bytes and sha256")
        if not isinstance(f.get("sha256"), str):
            raise DatasetError(f"prepared: {where}: {f['file']} has no sha256")
    return manifest


def checked_files(manifest: dict) -> list[dict]:
    """Every file the manifest vouches for ({"file", "bytes", "sha256"}): shards, captions, embeddings."""
    shards = manifest.get("shards")
    files = list(shards) if isinstance(shards, list) else []
    files.append(manifest.get("captions"))
    if manifest.get("embeddings") is not None:
        files.append(manifest["embeddings"])
    return files


def pinned(sha: str, pin: str | None, where: str | Path) -> None:
    """Refuse a manifest other than the one the run started on: its resume, or another node, would
    train on different data under the same name."""
    if pin is not None and sha != pin:
        raise DatasetError(
            f"prepared: {where} has changed since this run started (its sha256 is {sha[:16]}..., the run "
            f"started on {pin[:16]}...): the dataset was prepared or uploaded again under the same name. "
            "Put the original back, or start a new run on the new data"
        )


def bad_files(root: Path, manifest: dict, names: set[str] | None = None) -> list[str]:
    """The manifest's files (only `names` when given) that are missing or do not match their size and
    sha256, in manifest order.

    Every file is hashed, every time: a size-and-mtime stamp would let a bit flipped on the node's disk
    train. Files are hashed in parallel threads (hashlib releases the GIL), see docs/benchmarks.md.
    """
    files = [f for f in checked_files(manifest) if names is None or f["file"] in names]

    def bad(f: dict) -> bool:
        path = resolve_inside(root, f["file"], f"prepared: {root / MANIFEST}")
        return not path.is_file() or path.stat().st_size != f["bytes"] or sha256_file(path) != f["sha256"]

    from model.data.loader import cpus_available

    with ThreadPoolExecutor(max(1, min(len(files), cpus_available()))) as pool:
        flags = list(pool.map(bad, files))
    return [f["file"] for f, b in zip(files, flags, strict=True) if b]


def verify_files(root: Path, manifest: dict) -> None:
    """Every file of the manifest exists with its size and sha256; the first that does not fails naming it."""
    bad = bad_files(root, manifest)
    if not bad:
        return
    path = root / bad[0]
    if not path.is_file():
        raise DatasetError(f"prepared: {path} is missing (manifest lists it); re-run ablate data prepare")
    raise DatasetError(
        f"prepared: {path} does not match its checksum in {root / MANIFEST} (changed or damaged on disk, or "
        "partly copied); delete it and re-run ablate data prepare (it redoes only missing shards), or fetch it again"
    )


class PreparedDataset(CaptionedDataset):
    """data.dataset: prepared. Shards are memory-mapped; a batch is a gather of rows, no decoding."""

    name = "prepared"
    listing = CAPTIONS

    def __init__(
        self,
        root: Path,
        resolution: int,
        pixel_range: PixelRange,
        seed: int,
        held_out: int,
        needs_embeddings: bool = False,
        pin: str | None = None,
        verify: bool = True,
    ) -> None:
        """pin: the manifest's sha256 the run started on (a resume), refused if different. verify: hash
        every file now (False only for a copy its fetch verified moments ago)."""
        super().__init__(resolution, pixel_range, seed)
        if not root.is_dir():
            raise DatasetError(f"data.path {root} is not a directory (expected a prepared directory with {MANIFEST})")
        path = root / MANIFEST
        if not path.is_file():
            raise DatasetError(
                f"prepared: {path} is missing; make the directory with `ablate data prepare SRC --out {root}`"
            )
        raw = path.read_bytes()  # hashed and parsed from the same bytes: what is pinned is what is read
        self.manifest_sha256 = hashlib.sha256(raw).hexdigest()
        pinned(self.manifest_sha256, pin, path)
        manifest = parse_manifest(raw.decode("utf-8"), path)
        if manifest["resolution"] != resolution:
            raise DatasetError(
                f"prepared: {root} holds images at {manifest['resolution']} px but the run trains at {resolution}; "
                f"set data.resolution {manifest['resolution']} or prepare again with --resolution {resolution}"
            )
        if verify:
            verify_files(root, manifest)
        captions = resolve_inside(root, manifest["captions"]["file"], f"prepared: {path}")
        lines = [json.loads(x) for x in captions.read_text(encoding="utf-8").splitlines() if x.strip()]
        if len(lines) != manifest["count"]:
            raise DatasetError(f"prepared: {captions} has {len(lines)} lines, the manifest counts {manifest['count']}")
        entries = [Entry(f"{CAPTIONS} line {i + 1}", o["caption"], o.get("edit")) for i, o in enumerate(lines)]
        # (shard, row in shard) of every global row
        self._maps: list[np.ndarray] = []
        self._where: list[tuple[int, int]] = []
        for s, shard in enumerate(manifest["shards"]):
            arr = np.load(resolve_inside(root, shard["file"], f"prepared: {path}"), mmap_mode="r")
            if arr.dtype != np.uint8 or arr.shape[1:] != (3, resolution, resolution) or len(arr) != shard["count"]:
                raise DatasetError(
                    f"prepared: shard {root / shard['file']} is {arr.shape} {arr.dtype}, not as the manifest says"
                )
            self._maps.append(arr)
            self._where += [(s, i) for i in range(len(arr))]
        # cache_bytes 0: the page cache is the cache, shared by every arm of the node
        self._setup(root, entries, held_out, needs_embeddings, cache_bytes=0)

    def _decode(self, row: int) -> Tensor:
        s, i = self._where[row]
        return torch.from_numpy(np.array(self._maps[s][i]))  # a copy out of the map: (3, R, R) uint8

    def _check(self, row: int) -> None:
        pass  # every shard was hashed at start (or by its fetch)
