"""Prepared shards: a source decoded once at the training resolution (`ablate data prepare`), read
memory-mapped, so the arms of one node share one copy through the page cache and no arm decodes.

Layout of a prepared directory:
  manifest.json      {"format", "resolution", "count", "shards": [{"file", "count", "bytes", "sha256"}],
                      "source", "skipped": [unreadable inputs], "embeddings": "embeddings.pt" | null}
  shard-00000.npy    uint8 (n, 3, R, R), numpy's .npy format (np.load(mmap_mode="r") maps it)
  captions.jsonl     one {"caption", optional "edit"} per image, in shard order
  embeddings.pt      optional: caption -> (tokens, dim) float32, copied from the source
Checksums are verified at start; a shard that does not match fails naming it (see verify_shards).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from model.data.base import DatasetError, PixelRange
from model.data.captioned import CaptionedDataset, Entry

FORMAT = "ablate-prepared/1"
MANIFEST = "manifest.json"
CAPTIONS = "captions.jsonl"
VERIFIED = ".verified.json"  # size and mtime of shards whose checksum matched, so a restart need not rehash


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
        raise DatasetError(f"prepared: {where} has format {found!r}, expected {FORMAT!r}")
    return manifest


def read_manifest(root: Path) -> dict:
    path = root / MANIFEST
    if not path.is_file():
        raise DatasetError(
            f"prepared: {path} is missing; make the directory with `ablate data prepare SRC --out {root}`"
        )
    return parse_manifest(path.read_text(), path)


def first_bad_shard(root: Path, manifest: dict) -> str | None:
    """The file name of the first shard that is missing or does not match its manifest size and sha256;
    None when all match.

    A shard that matched before with the same size and mtime is not rehashed (the stamp is best-effort:
    a read-only directory rehashes every start).
    """
    stamp_path = root / VERIFIED
    try:
        stamps = json.loads(stamp_path.read_text()) if stamp_path.is_file() else {}
    except (OSError, json.JSONDecodeError):
        stamps = {}
    changed, bad = False, None
    for shard in manifest["shards"]:
        path = root / shard["file"]
        if not path.is_file():
            bad = shard["file"]
            break
        st = path.stat()
        key = [st.st_size, st.st_mtime_ns, shard["sha256"]]
        if stamps.get(shard["file"]) == key:
            continue
        if st.st_size != shard["bytes"] or sha256_file(path) != shard["sha256"]:
            bad = shard["file"]
            break
        stamps[shard["file"]] = key
        changed = True
    if changed:
        try:
            stamp_path.write_text(json.dumps(stamps))
        except OSError:
            pass  # read-only: verified again next start
    return bad


def verify_shards(root: Path, manifest: dict) -> None:
    """Every shard exists with its manifest size and sha256; the first that does not fails naming it."""
    bad = first_bad_shard(root, manifest)
    if bad is None:
        return
    path = root / bad
    if not path.is_file():
        raise DatasetError(f"prepared: shard {path} is missing (manifest lists it); re-run ablate data prepare")
    raise DatasetError(
        f"prepared: shard {path} does not match its checksum in {root / MANIFEST} (corrupt or partly "
        "copied); delete it and re-run ablate data prepare (it redoes only missing shards), or fetch it again"
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
    ) -> None:
        super().__init__(resolution, pixel_range, seed)
        if not root.is_dir():
            raise DatasetError(f"data.path {root} is not a directory (expected a prepared directory with {MANIFEST})")
        manifest = read_manifest(root)
        if manifest["resolution"] != resolution:
            raise DatasetError(
                f"prepared: {root} holds images at {manifest['resolution']} px but the run trains at {resolution}; "
                f"set data.resolution {manifest['resolution']} or prepare again with --resolution {resolution}"
            )
        verify_shards(root, manifest)
        lines = [json.loads(x) for x in (root / CAPTIONS).read_text(encoding="utf-8").splitlines() if x.strip()]
        if len(lines) != manifest["count"]:
            raise DatasetError(
                f"prepared: {root / CAPTIONS} has {len(lines)} lines, the manifest counts {manifest['count']}"
            )
        entries = [Entry(f"{CAPTIONS} line {i + 1}", o["caption"], o.get("edit")) for i, o in enumerate(lines)]
        # (shard, row in shard) of every global row
        self._maps: list[np.ndarray] = []
        self._where: list[tuple[int, int]] = []
        for s, shard in enumerate(manifest["shards"]):
            arr = np.load(root / shard["file"], mmap_mode="r")
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
        pass  # verified by checksum at start
