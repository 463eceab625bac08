"""The researcher's formats: Hugging Face imagefolder metadata, WebDataset tar shards, and prepared shards
(`prepare`: resumable, lists unreadable inputs and prepares the rest; a checksum mismatch fails at start)."""

from __future__ import annotations

import csv
import io
import json
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from pydantic import ValidationError

from model.data import DatasetError, ImageFolderDataset, PreparedDataset, TarShardsDataset, build_dataset
from model.data.prepare import prepare
from model.spec import ArmSpec

CAPTIONS = [f"a {c} thing number {i}" for i, c in enumerate(["red", "green", "blue", "yellow", "purple", "orange"])]


def png(i: int, size: tuple[int, int] = (30, 40)) -> bytes:
    arr = np.random.default_rng(i).integers(0, 255, (*size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def folder(root: Path, layout: str) -> Path:
    root.mkdir(parents=True)
    for i in range(len(CAPTIONS)):
        (root / f"img{i}.png").write_bytes(png(i))
    if layout == "captions.jsonl":
        lines = [json.dumps({"file": f"img{i}.png", "caption": c}) for i, c in enumerate(CAPTIONS)]
        (root / "captions.jsonl").write_text("\n".join(lines))
    elif layout == "metadata.jsonl":
        lines = [json.dumps({"file_name": f"img{i}.png", "text": c, "source": "x"}) for i, c in enumerate(CAPTIONS)]
        (root / "metadata.jsonl").write_text("\n".join(lines))
    else:
        with (root / "metadata.csv").open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["file_name", "caption", "width"])
            w.writerows([f"img{i}.png", c, 40] for i, c in enumerate(CAPTIONS))
    return root


def shards(root: Path) -> Path:
    root.mkdir(parents=True)
    for s in range(2):
        with tarfile.open(root / f"shard-{s:04d}.tar", "w") as tf:
            for i in range(3 * s, 3 * s + 3):
                for name, data in ((f"{i:06d}.png", png(i)), (f"{i:06d}.txt", CAPTIONS[i].encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    return root


def spec(**data: object) -> ArmSpec:
    return ArmSpec.model_validate(
        {"model": {"size": "tiny"}, "data": {"held_out": 1, **data}, "eval": {"num_samples": 1}}
    )


def all_items(ds) -> dict[str, torch.Tensor]:  # noqa: ANN001 - any dataset
    imgs, caps = ds._load("train", list(range(ds.num_train)))
    held, hcaps = ds._load("held", [0])
    return dict(zip(caps + hcaps, list(imgs) + list(held), strict=True))


@pytest.mark.parametrize("layout", ["captions.jsonl", "metadata.jsonl", "metadata.csv"])
def test_every_folder_layout_gives_the_same_items(tmp_path: Path, layout: str) -> None:
    ds = build_dataset(spec(dataset="imagefolder", path=str(folder(tmp_path / "f", layout)), resolution=16))
    ref = ImageFolderDataset(folder(tmp_path / "ref", "captions.jsonl"), 16, "unit", seed=0, held_out=1)
    a, b = all_items(ds), all_items(ref)
    assert a.keys() == set(CAPTIONS) and all(torch.equal(a[c], b[c]) for c in CAPTIONS)


def test_metadata_errors_name_the_column_and_the_fix(tmp_path: Path) -> None:
    root = folder(tmp_path / "f", "metadata.jsonl")
    (root / "metadata.jsonl").write_text(json.dumps({"file_name": "img0.png", "prompt": "x"}) + "\n")
    with pytest.raises(DatasetError, match=r"no caption column \(caption or text\).*set data.caption_column"):
        build_dataset(spec(dataset="imagefolder", path=str(root)))
    (root / "captions.jsonl").write_text("")
    with pytest.raises(DatasetError, match="captions.jsonl and metadata.jsonl; keep one listing"):
        build_dataset(spec(dataset="imagefolder", path=str(root)))
    with pytest.raises(ValueError, match="caption_column applies only to dataset 'imagefolder'"):
        spec(dataset="webdataset", path="/x", caption_column="prompt")


def test_webdataset_shards_read_by_offset(tmp_path: Path) -> None:
    root = shards(tmp_path / "wds")
    ds = build_dataset(spec(dataset="webdataset", path=str(root), resolution=16))
    assert isinstance(ds, TarShardsDataset) and ds.num_train == 5
    ref = ImageFolderDataset(folder(tmp_path / "ref", "captions.jsonl"), 16, "unit", seed=0, held_out=1)
    a, b = all_items(ds), all_items(ref)
    assert all(torch.equal(a[c], b[c]) for c in CAPTIONS)
    # over the cache cap: decoded per batch by offset
    big = TarShardsDataset(root, 16, "unit", seed=0, held_out=1, cache_bytes=0)
    assert big._cache is None and all(torch.equal(all_items(big)[c], b[c]) for c in CAPTIONS)


@pytest.mark.parametrize("kind", ["folder", "webdataset"])
def test_prepare_then_train_from_the_shards(tmp_path: Path, kind: str) -> None:
    src = folder(tmp_path / "src", "metadata.csv") if kind == "folder" else shards(tmp_path / "src")
    progress: list[tuple[int, int]] = []
    res = prepare(src, tmp_path / "out", 16, shard_bytes=3 * 16 * 16 * 4, on_item=lambda d, n: progress.append((d, n)))
    assert (res.count, res.shards, res.reused_shards, res.skipped) == (6, 2, 0, [])
    assert progress[-1] == (6, 6)
    manifest = json.loads((tmp_path / "out/manifest.json").read_text())
    assert [s["count"] for s in manifest["shards"]] == [4, 2] and all(
        len(s["sha256"]) == 64 for s in manifest["shards"]
    )
    ds = build_dataset(spec(dataset="prepared", path=str(tmp_path / "out"), resolution=16))
    assert isinstance(ds, PreparedDataset)
    ref = ImageFolderDataset(folder(tmp_path / "ref", "captions.jsonl"), 16, "unit", seed=0, held_out=1)
    a, b = all_items(ds), all_items(ref)
    assert all(torch.equal(a[c], b[c]) for c in CAPTIONS)
    with pytest.raises(DatasetError, match=r"holds images at 16 px but the run trains at 32.*--resolution 32"):
        build_dataset(spec(dataset="prepared", path=str(tmp_path / "out"), resolution=32))


def test_prepare_lists_unreadable_files_and_resumes(tmp_path: Path) -> None:
    src = folder(tmp_path / "src", "captions.jsonl")
    (src / "img2.png").write_bytes(b"not an image")
    (src / "img5.png").unlink()
    out = tmp_path / "out"
    res = prepare(src, out, 16, shard_bytes=3 * 16 * 16 * 2, max_unreadable=0.5)
    assert res.count == 4 and res.shards == 3 and len(res.skipped) == 2
    assert "img2.png is corrupt" in res.skipped[0] and "img5.png does not exist" in res.skipped[1]
    # interrupted after shard 0: the re-run keeps shards 0 and 2, redoes shard 1
    (out / "shard-00001.json").unlink()
    again = prepare(src, out, 16, shard_bytes=3 * 16 * 16 * 2, max_unreadable=0.5)
    assert (again.count, again.reused_shards) == (4, 2)
    with pytest.raises(DatasetError, match="another source, resolution or shard size"):
        prepare(src, out, 16, shard_bytes=3 * 16 * 16 * 3, max_unreadable=0.5)


def test_a_shard_checksum_mismatch_fails_at_start_naming_it(tmp_path: Path) -> None:
    prepare(folder(tmp_path / "src", "captions.jsonl"), tmp_path / "out", 16, shard_bytes=3 * 16 * 16 * 4)
    s = spec(dataset="prepared", path=str(tmp_path / "out"), resolution=16)
    build_dataset(s)  # verified
    shard = tmp_path / "out/shard-00001.npy"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match=r"shard-00001.npy does not match its checksum"):
        build_dataset(s)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"dataset": "prepared", "url": "http://example.org/faces"}, "must start with one of file://, s3://, sftp://"),
        ({"dataset": "prepared", "url": "/data/faces"}, "must start with one of"),
        ({"dataset": "imagefolder", "url": "s3://lab/faces"}, "set data.dataset 'prepared'"),
        ({"dataset": "prepared", "url": "s3://lab/faces", "path": "/data/faces"}, "not both"),
        ({"dataset": "prepared"}, "needs data.path"),
        ({"dataset": "prepared", "urls": "s3://lab/faces"}, "urls"),  # a misspelt key is an error
    ],
)
def test_data_url_is_validated(data: dict, needle: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(needle)):
        spec(**data)
    assert spec(dataset="prepared", url="s3://lab/faces").data.url == "s3://lab/faces"
