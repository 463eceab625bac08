"""What a run records about its data, through train_arm on CPU: unreadable images left out and named
(fallbacks, unreadable.txt, skipped_images) with one limit over the whole run, resume included; and the
prepared manifest a run started on, which its resume refuses to trade for another."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import model.data.captioned as captioned
from model.data import DatasetError, ImageFolderDataset
from model.data.base import step_indices
from model.data.prepare import prepare
from orchestrator.grids.arms import deep_merge, resolve
from worker.train import train_arm

N, BATCH, RES = 200, 8, 16  # 2 unreadable of 200 is the default 1%: trains; 3 fails

QUICK: dict[str, Any] = {
    "model": {"size": "tiny"},
    "data": {"held_out": 1, "resolution": RES, "loader_workers": 0},
    "schedule": {"steps": 4, "batch_size": BATCH, "warmup_steps": 1, "checkpoint_every": 2, "ema": {"warmup_steps": 1}},
    "eval": {"num_samples": 1, "sampler_steps": 2, "lpips_backbone": "random_standin"},
    "precision": {"mode": "fp32"},
}


def png(i: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(i).integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def photos(root: Path, n: int, salt: int = 0) -> Path:
    root.mkdir(parents=True)
    for i in range(n):
        (root / f"p{i:03d}.png").write_bytes(png(i + salt))
    lines = [json.dumps({"file": f"p{i:03d}.png", "caption": f"a red photo {i}"}) for i in range(n)]
    (root / "captions.jsonl").write_text("\n".join(lines))
    return root


def first_segment(spec: Any, out: Path) -> dict[str, Any]:
    """Train to the first checkpoint (step 2) and stop there, as a killed worker would."""
    run = train_arm(spec, out)
    record = next(run)
    run.close()
    return record


def drawn(root: Path, step: int, k: int) -> int:
    """The listing row of the k-th training item of `step` (the trainer's draw: a pure function)."""
    ds = ImageFolderDataset(root, RES, "unit", seed=0, held_out=1)
    return ds._train[step_indices(1, step, BATCH, ds.num_train)[k]]  # data.seed 0, + 1 for the stream


def test_unreadable_images_are_named_on_the_run_and_counted_across_a_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(captioned, "CACHE_BYTES", 0)  # decoded per batch, so files fail mid-run
    root = photos(tmp_path / "d", N)
    a, b, c = drawn(root, 0, 0), drawn(root, 2, 0), drawn(root, 2, 1)
    assert len({a, b, c}) == 3
    name = {r: f"p{r:03d}.png (captions.jsonl line {r + 1})" for r in (a, b, c)}

    def break_(r: int) -> None:  # a readable header, pixels cut off: only decoding finds it
        (root / f"p{r:03d}.png").write_bytes(png(r)[:60])

    def mend(r: int) -> None:
        (root / f"p{r:03d}.png").write_bytes(png(r))

    spec = resolve("A", deep_merge(QUICK, {"data": {"dataset": "imagefolder", "path": str(root)}}))
    out = tmp_path / "run"
    break_(a)
    rec = first_segment(spec, out)  # 0.5%: trains, a named
    assert rec["step"] == 2 and rec["skipped_images"] == 1 and rec["skipped_files"] == [name[a]]
    assert f"unreadable image left out: {name[a]}" in rec["fallbacks"]
    assert (out / "unreadable.txt").read_text() == f"{name[a]}\n"

    # The resumed segment no longer draws a (mended), draws b and c: 3 of 200 over the run is past 1%.
    mend(a)
    break_(b)
    break_(c)
    with pytest.raises(DatasetError, match=r"3 of 200 images are unreadable, more than data.max_unreadable") as info:
        list(train_arm(spec, out))
    assert all(name[r] in str(info.value) for r in (a, b, c))

    mend(c)  # 2 of 200 (1%) over the run: it trains to the end, both named
    final = list(train_arm(spec, out))[-1]
    assert final["step"] == 4 and final["skipped_images"] == 2 and final["skipped_files"] == [name[a], name[b]]
    assert (out / "unreadable.txt").read_text().splitlines() == [name[a], name[b]]


def test_a_resume_refuses_a_manifest_other_than_the_one_the_run_started_on(tmp_path: Path) -> None:
    prep = tmp_path / "prep"
    prepare(photos(tmp_path / "src", 12), prep, RES)
    spec = resolve("A", deep_merge(QUICK, {"data": {"dataset": "prepared", "path": str(prep)}}))
    out = tmp_path / "run"
    rec = first_segment(spec, out)
    assert rec["data_manifest_sha256"] == hashlib.sha256((prep / "manifest.json").read_bytes()).hexdigest()
    # prepared again in place from other photos: shards and manifest agree, but not with what the run began on
    for p in prep.iterdir():
        p.unlink()
    prepare(photos(tmp_path / "other", 12, salt=1000), prep, RES)
    with pytest.raises(DatasetError, match=r"manifest.json has changed since this run started"):
        list(train_arm(spec, out))
