"""Data a run can trust: unreadable images are left out and named up to data.max_unreadable (cached,
per-batch and tar paths; prepare too), listing and manifest names stay inside the dataset directory, and a
prepared directory whose files changed on disk is refused at start."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from model.data import DatasetError, ImageFolderDataset, TarShardsDataset, build_dataset
from model.data.loader import StepBatches, make_loader
from model.data.prepare import prepare
from model.data.unreadable import Unreadable
from model.spec import ArmSpec

N = 100  # 1 unreadable is 1% (the default limit: trains), 2 are 2% (fails)


def png(i: int) -> bytes:
    arr = np.random.default_rng(i).integers(0, 255, (8, 10, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def truncated(i: int) -> bytes:
    """A PNG whose header reads but whose pixels do not: passes the header check, fails to decode."""
    return png(i)[:60]


def photos(root: Path, bad: dict[int, bytes] | None = None, n: int = N) -> Path:
    root.mkdir(parents=True)
    for i in range(n):
        (root / f"p{i:03d}.png").write_bytes((bad or {}).get(i, png(i)))
    lines = [json.dumps({"file": f"p{i:03d}.png", "caption": f"a red photo {i}"}) for i in range(n)]
    (root / "captions.jsonl").write_text("\n".join(lines))
    return root


def tar_shards(root: Path, bad: dict[int, bytes]) -> Path:
    root.mkdir(parents=True)
    with tarfile.open(root / "shard-0000.tar", "w") as tf:
        for i in range(N):
            for name, data in ((f"{i:06d}.png", bad.get(i, png(i))), (f"{i:06d}.txt", f"a red photo {i}".encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return root


def spec(**data: object) -> ArmSpec:
    return ArmSpec.model_validate(
        {"model": {"size": "tiny"}, "data": {"held_out": 1, "resolution": 8, **data}, "eval": {"num_samples": 1}}
    )


def open_path(kind: str, root: Path) -> ImageFolderDataset | TarShardsDataset:
    if kind == "tar":
        return TarShardsDataset(root, 8, "unit", seed=0, held_out=1)
    return ImageFolderDataset(root, 8, "unit", seed=0, held_out=1, cache_bytes=0 if kind == "per-batch" else None)


def make(kind: str, root: Path, bad: dict[int, bytes]) -> Path:
    return tar_shards(root, bad) if kind == "tar" else photos(root, bad)


def name_of(kind: str, i: int) -> str:
    return f"shard-0000.tar member {i:06d}.png" if kind == "tar" else f"p{i:03d}.png (captions.jsonl line {i + 1})"


@pytest.mark.parametrize("kind", ["cached", "per-batch", "tar"])
def test_unreadable_at_start_just_under_and_just_over_the_limit(tmp_path: Path, kind: str) -> None:
    """Found at start (decoded within the cache cap, header-checked above it): 1% is left out and named,
    2% fails naming both."""
    ds = open_path(kind, make(kind, tmp_path / "one", {17: b"not an image"}))
    assert ds.unreadable.first() == [name_of(kind, 17)]
    assert 17 not in ds._train + ds._held and ds.num_train == N - 2  # 1 left out, 1 held out
    over = rf"2 of 100 images are unreadable, more than data.max_unreadable \(1.0%\): {re.escape(name_of(kind, 17))}"
    with pytest.raises(DatasetError, match=over) as info:
        open_path(kind, make(kind, tmp_path / "two", {17: b"not an image", 60: b""}))
    assert name_of(kind, 60) in str(info.value)


@pytest.mark.parametrize("kind", ["per-batch", "tar"])
def test_unreadable_mid_run_counts_against_the_same_limit(tmp_path: Path, kind: str) -> None:
    """Above the cache cap a file whose header reads but whose pixels do not is found by a loader worker;
    it joins those found at start under one limit."""
    root = tmp_path / "d"
    if kind == "tar":
        ds: ImageFolderDataset | TarShardsDataset = TarShardsDataset(
            tar_shards(root, {5: truncated(5)}), 8, "unit", seed=0, held_out=1, cache_bytes=0
        )
    else:
        ds = ImageFolderDataset(photos(root, {5: truncated(5)}), 8, "unit", seed=0, held_out=1, cache_bytes=0)
    assert ds.unreadable.count == 0  # its header passed
    batches = StepBatches(ds, batch_size=N, micro_batch=N, seed=0, identity_prob=0.5)
    skipped = {name for mb in make_loader(batches, 0, 3, workers=1, pin=False) for name in mb.skipped}
    assert skipped == {name_of(kind, 5)}
    ds.unreadable.add(skipped)  # what the trainer does with each micro-batch: 1% goes on
    with pytest.raises(DatasetError, match=rf"2 of 100 images are unreadable.*{re.escape(name_of(kind, 5))}, x"):
        ds.unreadable.add(["x"])


def test_max_unreadable_is_the_spec_limit(tmp_path: Path) -> None:
    root = photos(tmp_path / "d", {1: b"", 2: b"", 3: b""})
    ds = build_dataset(spec(dataset="imagefolder", path=str(root), max_unreadable=0.03))
    assert ds.unreadable.count == 3  # type: ignore[attr-defined]
    with pytest.raises(DatasetError, match="3 of 100 images are unreadable"):
        build_dataset(spec(dataset="imagefolder", path=str(root), max_unreadable=0.02))
    with pytest.raises(ValueError, match="max_unreadable"):
        spec(dataset="imagefolder", path=str(root), max_unreadable=1.5)


def test_prepare_applies_the_limit_and_writes_no_manifest_past_it(tmp_path: Path) -> None:
    src = photos(tmp_path / "src", {3: b"", 40: b"not an image"})
    with pytest.raises(DatasetError, match=r"2 of 100 images are unreadable, more than --max-unreadable.*p003\.png"):
        prepare(src, tmp_path / "out", 8)
    assert not (tmp_path / "out/manifest.json").exists()
    res = prepare(src, tmp_path / "out", 8, max_unreadable=0.02)  # the finished shard is kept
    assert res.count == 98 and len(res.skipped) == 2 and res.reused_shards == 1


# ---------------------------------------------------------------- names stay inside


def outside(tmp_path: Path) -> Path:
    """A readable image next to the dataset directory: what a hostile listing would reach for."""
    (tmp_path / "elsewhere").mkdir()
    target = tmp_path / "elsewhere/secret.png"
    target.write_bytes(png(999))
    return target


@pytest.mark.parametrize(
    ("listing", "how"),
    [
        ("captions.jsonl", "dotdot"),
        ("metadata.jsonl", "absolute"),
        ("metadata.csv", "symlink"),
    ],
)
def test_a_listing_name_that_leads_out_of_the_folder_is_refused(tmp_path: Path, listing: str, how: str) -> None:
    target = outside(tmp_path)
    root = photos(tmp_path / "d", n=4)
    (root / "captions.jsonl").unlink()
    if how == "symlink":
        (root / "link.png").symlink_to(target)
    name = {"dotdot": "../elsewhere/secret.png", "absolute": str(target), "symlink": "link.png"}[how]
    files = ["p000.png", "p001.png", name, "p003.png"]
    if listing == "metadata.csv":
        with (root / listing).open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["file_name", "caption"])
            w.writerows([f, f"a red photo {i}"] for i, f in enumerate(files))
        line = "row 4"
    else:
        key = "file" if listing == "captions.jsonl" else "file_name"
        text = "caption" if key == "file" else "text"
        lines = [json.dumps({key: f, text: f"red {i}"}) for i, f in enumerate(files)]
        (root / listing).write_text("\n".join(lines))
        line = "line 3"
    with pytest.raises(DatasetError, match=rf"{listing} {line}: .*outside the dataset directory"):
        build_dataset(spec(dataset="imagefolder", path=str(root)))


def prepared(tmp_path: Path, n: int = 12) -> Path:
    out = tmp_path / "prep"
    prepare(photos(tmp_path / "src", n=n), out, 8, shard_bytes=3 * 8 * 8 * 8)
    return out


def test_a_manifest_shard_name_that_leads_out_is_refused(tmp_path: Path) -> None:
    out = prepared(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    os.replace(out / "shard-00001.npy", tmp_path / "elsewhere/shard-00001.npy")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"][1]["file"] = "../elsewhere/shard-00001.npy"
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DatasetError, match=r"manifest.json: '../elsewhere/shard-00001.npy' resolves to .*outside"):
        build_dataset(spec(dataset="prepared", path=str(out)))


# ---------------------------------------------------------------- what a prepared run trains on


def flip_keeping_mtime(path: Path) -> None:
    """A bit flipped on disk with the file's size and mtime unchanged, as a failing disk does it."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_bit_flip_in_a_verified_shard_is_caught_at_the_next_start(tmp_path: Path) -> None:
    out = prepared(tmp_path)
    s = spec(dataset="prepared", path=str(out))
    build_dataset(s)  # verified once
    flip_keeping_mtime(out / "shard-00000.npy")
    with pytest.raises(DatasetError, match=r"shard-00000.npy does not match its checksum"):
        build_dataset(s)


def test_captions_and_embeddings_are_checksummed(tmp_path: Path) -> None:
    src = photos(tmp_path / "src", n=12)
    import torch

    torch.save({f"a red photo {i}": torch.ones(2, 4) * i for i in range(12)}, src / "embeddings.pt")
    out = tmp_path / "prep"
    prepare(src, out, 8)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["captions"]["sha256"] == hashlib.sha256((out / "captions.jsonl").read_bytes()).hexdigest()
    assert manifest["embeddings"]["file"] == "embeddings.pt"
    s = spec(dataset="prepared", path=str(out), text_encoder="precomputed")
    build_dataset(s)
    text = (out / "captions.jsonl").read_text()
    (out / "captions.jsonl").write_text(text.replace("a red photo 3", "a red photo 4"))  # same line count
    with pytest.raises(DatasetError, match=r"captions.jsonl does not match its checksum"):
        build_dataset(s)
    (out / "captions.jsonl").write_text(text)
    flip_keeping_mtime(out / "embeddings.pt")
    with pytest.raises(DatasetError, match=r"embeddings.pt does not match its checksum"):
        build_dataset(s)


def test_a_pinned_manifest_refuses_a_swapped_one(tmp_path: Path) -> None:
    out = prepared(tmp_path)
    first = build_dataset(spec(dataset="prepared", path=str(out)))
    pin = first.manifest_sha256  # type: ignore[attr-defined]
    assert pin == hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest()
    assert build_dataset(spec(dataset="prepared", path=str(out)), pin=pin).num_train == first.num_train
    # prepared again from other photos, shards and manifest together: every checksum matches its manifest
    for p in out.iterdir():
        p.unlink()
    prepare(photos(tmp_path / "other", n=12, bad={0: png(500)}), out, 8, shard_bytes=3 * 8 * 8 * 8)
    build_dataset(spec(dataset="prepared", path=str(out)))  # a new run may use it
    with pytest.raises(DatasetError, match=r"manifest.json has changed since this run started"):
        build_dataset(spec(dataset="prepared", path=str(out)), pin=pin)


def test_unreadable_rule_is_one_counter() -> None:
    u = Unreadable(total=200, limit=0.005, what="imagefolder d")
    u.add(["a", "a"])
    assert u.count == 1  # once per image, however often drawn
    with pytest.raises(DatasetError, match=r"2 of 200 images are unreadable, more than data.max_unreadable \(0.5%\)"):
        u.add(["b"])


def bomb() -> bytes:
    """A 100-byte PNG whose header claims 20000 x 20000 pixels: over twice Pillow's MAX_IMAGE_PIXELS."""
    import struct
    import zlib

    data = bytearray(png(0))
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", 20_000, 20_000)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


@pytest.mark.parametrize("kind", ["cached", "per-batch", "tar"])
def test_a_decompression_bomb_is_an_unreadable_image(tmp_path: Path, kind: str) -> None:
    """One bomb among 100 images is left out and named (1%); two fail as too many unreadable."""
    ds = open_path(kind, make(kind, tmp_path / "one", {17: bomb()}))
    assert ds.unreadable.first() == [name_of(kind, 17)] and 17 not in ds._train + ds._held
    with pytest.raises(DatasetError, match=r"2 of 100 images are unreadable.*decompression bomb"):
        open_path(kind, make(kind, tmp_path / "two", {17: bomb(), 60: bomb()}))


def test_a_sparse_or_oversized_tar_member_is_unreadable_and_never_read(tmp_path: Path) -> None:
    """A shard of a few KB whose caption member claims 1.2 GB (GNU tar --sparse of a hole), and a caption
    over MAX_CAPTION_BYTES: both samples are unreadable files under data.max_unreadable, and opening the
    shards allocates nothing near what the members claim."""
    import subprocess
    import tracemalloc

    from model.data.tar import MAX_CAPTION_BYTES

    files = tmp_path / "files"
    files.mkdir()
    for i in range(N):
        (files / f"{i:06d}.png").write_bytes(png(i))
        (files / f"{i:06d}.txt").write_text(f"a red photo {i}")
    os.truncate(files / "000017.txt", 1_200_000_000)  # a hole: a sparse member once tarred with --sparse
    (files / "000060.txt").write_bytes(b"a" * (MAX_CAPTION_BYTES + 1))
    root = tmp_path / "shards"
    root.mkdir()
    names = sorted(p.name for p in files.iterdir())
    subprocess.run(["tar", "--sparse", "-cf", str(root / "shard-0000.tar"), "-C", str(files), *names], check=True)
    assert (root / "shard-0000.tar").stat().st_size < 8 << 20
    tracemalloc.start()
    ds = TarShardsDataset(root, 8, "unit", seed=0, held_out=1, max_unreadable=0.05)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert ds.unreadable.first() == [name_of("tar", 17), name_of("tar", 60)], ds.unreadable.first()
    assert "sparse member" in str(ds.unreadable.first_reason)
    assert peak < 64 << 20, f"opening the shard held {peak >> 20} MiB"
    with pytest.raises(DatasetError, match=r"2 of 100 images are unreadable"):
        TarShardsDataset(root, 8, "unit", seed=0, held_out=1)
