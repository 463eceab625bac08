"""The loader: step s's micro-batches are a pure function of (seed, s), whatever the worker count and the
micro-batch size; files that fail to decode are replaced and counted; the worker count follows the CPUs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from model.data import DatasetError, ImageFolderDataset, ShapesDataset, step_indices
from model.data.loader import StepBatches, auto_workers, make_loader
from model.data.unreadable import Unreadable


def stream(batches: StepBatches, start: int, steps: int, workers: int) -> list:
    return [
        (mb.step, mb.micro, mb.images, mb.captions, mb.identity)
        for mb in make_loader(batches, start, steps, workers, pin=False)
    ]


def same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x[:2] == y[:2] and torch.equal(x[2], y[2]) and x[3:] == y[3:]


def test_stream_is_the_same_with_any_worker_count_and_from_any_start() -> None:
    ds = ShapesDataset(16, "unit", seed=3, num_images=64, held_out=2)
    batches = StepBatches(ds, batch_size=4, micro_batch=2, seed=5, identity_prob=0.5)
    inline = stream(batches, 0, 6, workers=0)
    same(inline, stream(batches, 0, 6, workers=2))
    same(inline[6:], stream(batches, 3, 6, workers=2))  # a resume at step 3 sees steps 3..5 as they were
    assert [(s, j) for s, j, *_ in inline] == [(s, j) for s in range(6) for j in range(2)]
    assert len({x[4] for x in inline}) == 2  # identity conditioning is drawn, both ways


def test_global_batch_does_not_depend_on_the_micro_batch() -> None:
    ds = ShapesDataset(16, "unit", seed=0, num_images=64, held_out=2)
    whole = stream(StepBatches(ds, 8, 8, seed=1, identity_prob=0.5), 0, 3, 0)
    split = stream(StepBatches(ds, 8, 2, seed=1, identity_prob=0.5), 0, 3, 0)
    for s in range(3):
        assert torch.equal(whole[s][2], torch.cat([x[2] for x in split[4 * s : 4 * s + 4]]))
    assert not np.array_equal(step_indices(1, 0, 8, 64), step_indices(1, 1, 8, 64))


def test_a_file_that_fails_to_decode_is_replaced_and_counted(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    lines = []
    for i in range(10):
        Image.fromarray(rng.integers(0, 255, (200, 200, 3), dtype=np.uint8)).save(tmp_path / f"i{i}.jpg", quality=90)
        lines.append(json.dumps({"file": f"i{i}.jpg", "caption": f"red thing {i}"}))
    (tmp_path / "captions.jsonl").write_text("\n".join(lines))
    # a valid header with its data cut off: passes the start-up check, fails when decoded
    data = (tmp_path / "i7.jpg").read_bytes()
    (tmp_path / "i7.jpg").write_bytes(data[: len(data) // 3])
    ds = ImageFolderDataset(tmp_path, 16, "unit", seed=0, held_out=1, cache_bytes=0)
    batches = StepBatches(ds, batch_size=9, micro_batch=9, seed=0, identity_prob=0.5)
    seen: list[str] = []
    for mb in make_loader(batches, 0, 20, workers=2, pin=False):
        assert mb.images.shape == (9, 3, 16, 16) and mb.images.dtype == torch.uint8
        seen += mb.skipped
    assert seen and set(seen) == {"i7.jpg (captions.jsonl line 8)"}
    counter = Unreadable(total=1000, limit=0.01, what="imagefolder")
    counter.add(seen)
    assert counter.count == 1  # once per file, however often drawn
    many = Unreadable(total=100, limit=0.01, what="imagefolder x")
    many.add(["a"])  # 1% is allowed
    with pytest.raises(DatasetError, match=r"x: 2 of 100 images are unreadable, more than .*: a, b\."):
        many.add(["b"])


def test_auto_workers_share_the_cpus_between_the_gpus() -> None:
    assert auto_workers("cuda", cpus=64, gpus=4) == 8  # 16 per arm, capped
    assert auto_workers("cuda", cpus=16, gpus=4) == 3  # one core left for the training thread
    assert auto_workers("cuda", cpus=2, gpus=4) == 1
    assert auto_workers("cpu", cpus=64, gpus=1) == 1
