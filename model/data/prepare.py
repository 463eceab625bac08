"""`ablate data prepare`: decode a folder (captions.jsonl or Hugging Face metadata) or WebDataset tar
shards once into uint8 shards at the training resolution, with a manifest of counts and checksums.

Resumable: shard k always holds source items [k * per_shard, (k + 1) * per_shard) and is written as
shard-k.npy plus a small shard-k.json sidecar (its captions, count, checksum, unreadable inputs), each
renamed into place when complete; a re-run keeps every shard whose sidecar exists and does the rest.
Unreadable inputs are listed (in the sidecars and the manifest) and left out; the rest are prepared,
unless more than max_unreadable of the source is unreadable (the rule a run applies, unreadable.py).
"""

from __future__ import annotations

import json
import multiprocessing
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from model.data.base import DatasetError
from model.data.captioned import Entry
from model.data.folder import LISTINGS, decode_image, load_image, read_listing
from model.data.prepared import CAPTIONS, FORMAT, MANIFEST, sha256_file
from model.data.tar import TarReader, index_shards
from model.data.unreadable import Unreadable
from model.spec import MAX_UNREADABLE

EMBEDDINGS = "embeddings.pt"
SHARD_BYTES = 1 << 30  # ~1 GiB per shard: few files, and a corrupt one costs little to redo


@dataclass
class Source:
    """What prepare reads: entries and how to decode entry i to (3, R, R) uint8."""

    kind: str
    entries: list[Entry]
    decode: Callable[[int, int], Tensor]  # (row, resolution) -> image; DatasetError if unreadable
    embeddings: Path | None = None


def open_source(src: Path, caption_column: str | None = None) -> Source:
    """A folder with a listing file, or a directory of WebDataset *.tar shards."""
    if not src.is_dir():
        raise DatasetError(f"{src} is not a directory (a folder of images with captions, or *.tar shards)")
    emb = next((src / n for n in ("embeddings.pt", "embeddings.npy") if (src / n).is_file()), None)
    if any((src / n).is_file() for n in LISTINGS):
        listing, pairs = read_listing(src, caption_column)
        entries, files = [e for e, _ in pairs], [p for _, p in pairs]
        return Source(listing, entries, lambda r, res: load_image(files[r], res, f" ({entries[r].where})"), emb)
    if any(src.glob("*.tar")):
        shards, entries, members = index_shards(src)
        reader = TarReader(shards)
        return Source(
            "webdataset", entries, lambda r, res: decode_image(reader.read(members[r]), res, entries[r].where), emb
        )
    raise DatasetError(f"{src} has neither {', '.join(LISTINGS)} nor *.tar shards")


_SOURCE: tuple[Source, int] | None = None  # the source a forked decode worker reads (set before the fork)


def _decode_row(row: int) -> tuple[int, np.ndarray | None, str | None]:
    assert _SOURCE is not None
    source, resolution = _SOURCE
    try:
        return row, source.decode(row, resolution).numpy(), None
    except DatasetError as exc:
        return row, None, str(exc)


def _decoded(
    source: Source, resolution: int, rows: range, workers: int
) -> Iterator[tuple[int, np.ndarray | None, str | None]]:
    """(row, image or None, error or None) in row order, decoded by `workers` forked processes."""
    global _SOURCE
    _SOURCE = (source, resolution)
    if workers <= 1:
        yield from map(_decode_row, rows)
        return
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        yield from pool.imap(_decode_row, rows, chunksize=4)


@dataclass
class PrepareResult:
    out: Path
    count: int
    shards: int
    reused_shards: int  # complete from an earlier, interrupted run
    skipped: list[str] = field(default_factory=list)  # unreadable inputs, "where: why"


def _aligned_embeddings(path: Path, entries: list[Entry]) -> dict[str, Tensor]:
    """The source's embeddings as caption -> tensor (aligned arrays are keyed by their entry's caption),
    so dropping unreadable images cannot misalign them."""
    data = (
        torch.load(path, map_location="cpu", weights_only=True)
        if path.suffix == ".pt"
        else torch.from_numpy(np.load(path))
    )
    if isinstance(data, dict):
        return {str(k): v for k, v in data.items()}
    if len(data) != len(entries):
        raise DatasetError(f"{path}: first dimension {len(data)} != {len(entries)} entries of the source")
    return {e.caption: data[i] for i, e in enumerate(entries)}


def _checksum(out: Path, name: str) -> dict[str, object]:
    return {"file": name, "bytes": (out / name).stat().st_size, "sha256": sha256_file(out / name)}


def prepare(
    src: Path,
    out: Path,
    resolution: int,
    *,
    caption_column: str | None = None,
    shard_bytes: int = SHARD_BYTES,
    on_item: Callable[[int, int], None] | None = None,
    workers: int | None = None,
    max_unreadable: float = MAX_UNREADABLE,
) -> PrepareResult:
    """Prepare `src` into `out` at `resolution`. on_item(done, total) after every source item (progress bar).
    workers: decode processes (default: the CPUs this process may use). Past `max_unreadable` of the
    source unreadable, fails naming the first ten and writes no manifest (finished shards are kept, so a
    re-run with a higher limit redoes nothing)."""
    from model.data.loader import cpus_available

    workers = cpus_available() if workers is None else workers
    source = open_source(src, caption_column)
    n = len(source.entries)
    unreadable = Unreadable(n, max_unreadable, f"prepare {src}", knob="--max-unreadable")
    per_shard = max(1, shard_bytes // (3 * resolution * resolution))
    out.mkdir(parents=True, exist_ok=True)
    old = out / MANIFEST
    if old.is_file():
        prev = json.loads(old.read_text())
        if prev.get("resolution") != resolution:
            raise DatasetError(f"{out} holds a dataset prepared at {prev.get('resolution')} px; use another --out")
    plan = out / "plan.json"  # the shard split must match the one the finished sidecars were made with
    want = {"source": str(src.resolve()), "resolution": resolution, "per_shard": per_shard, "count": n}
    if plan.is_file() and json.loads(plan.read_text()) != want:
        raise DatasetError(
            f"{out} was started for another source, resolution or shard size ({plan}); use another --out"
        )
    plan.write_text(json.dumps(want))

    shards, skipped, reused, done = [], [], 0, 0
    for k, start in enumerate(range(0, n, per_shard)):
        rows = range(start, min(n, start + per_shard))
        name = f"shard-{k:05d}"
        side = out / f"{name}.json"
        if side.is_file() and (out / f"{name}.npy").is_file():
            meta = json.loads(side.read_text())
            reused += 1
            done += len(rows)
            if on_item is not None:
                on_item(done, n)
        else:
            images, lines, bad = [], [], []
            for r, image, error in _decoded(source, resolution, rows, workers):
                if image is None:
                    bad.append(str(error))
                else:
                    images.append(image)
                    e = source.entries[r]
                    lines.append({"caption": e.caption, **({"edit": e.edit} if e.edit else {})})
                done += 1
                if on_item is not None:
                    on_item(done, n)
            arr = np.stack(images) if images else np.zeros((0, 3, resolution, resolution), np.uint8)
            tmp = out / f"{name}.npy.part"
            with tmp.open("wb") as fh:
                np.save(fh, arr)
            os.replace(tmp, out / f"{name}.npy")
            meta = {
                "file": f"{name}.npy",
                "count": len(arr),
                "bytes": (out / f"{name}.npy").stat().st_size,
                "sha256": sha256_file(out / f"{name}.npy"),
                "captions": lines,
                "skipped": bad,
            }
            tmp_side = out / f"{name}.json.part"
            tmp_side.write_text(json.dumps(meta))
            os.replace(tmp_side, side)
        shards.append(meta)
        skipped += meta["skipped"]
        unreadable.add(meta["skipped"], reason=None)  # fails as soon as the share is past the limit

    captions = [line for m in shards for line in m["captions"]]
    (out / CAPTIONS).write_text("".join(json.dumps(x) + "\n" for x in captions), encoding="utf-8")
    embeddings = None
    if source.embeddings is not None:
        torch.save(_aligned_embeddings(source.embeddings, source.entries), out / EMBEDDINGS)
        embeddings = _checksum(out, EMBEDDINGS)
    manifest = {
        "format": FORMAT,
        "resolution": resolution,
        "count": len(captions),
        "source": str(src),
        "source_kind": source.kind,
        "shards": [{k: m[k] for k in ("file", "count", "bytes", "sha256")} for m in shards],
        "captions": _checksum(out, CAPTIONS),
        "embeddings": embeddings,
        "skipped": skipped,
    }
    tmp = out / f"{MANIFEST}.part"
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, out / MANIFEST)
    return PrepareResult(out, len(captions), len(shards), reused, skipped)
