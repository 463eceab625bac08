"""Sample PNGs at every evaluation: the budget per checkpoint, the files and manifest the trainer writes,
the same prompts, targets and noise in every arm of a grid."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from orchestrator.grids.arms import deep_merge, resolve
from tests.kit.settings import QUICK
from worker.samples import BUDGET_BYTES, MAX_SIDE, encode, write_samples
from worker.train import train_arm


def _noise_images(side: int) -> dict[str, list[tuple[str, torch.Tensor]]]:
    g = torch.Generator().manual_seed(0)
    rand = lambda: torch.rand(3, side, side, generator=g)  # noqa: E731 - incompressible: the worst case
    return {
        "target": [(f"c{i}", rand()) for i in range(4)],
        "recon": [(f"c{i}", rand()) for i in range(4)],
        "text": [(f"c{i}", rand()) for i in range(4)],
        "caption": [("a red square", rand()), ("a red circle", rand())],
        "edit": [("a green square", rand()), ("a green circle", rand())],
    }


def test_a_broken_arm_at_seed_resolution_stays_within_the_budget() -> None:
    """16 images of pure noise at 1024 px (what a collapsed seed-size arm generates) fit BUDGET_BYTES."""
    files, entries, side = encode(_noise_images(1024))
    assert sum(len(b) for b in files.values()) <= BUDGET_BYTES
    assert side < MAX_SIDE  # the full-side encoding did not fit: encoded again smaller
    assert len(files) == len(entries) == 16
    png = Image.open(io.BytesIO(files["recon_0.png"]))
    assert png.format == "PNG" and png.size == (side, side)


def test_small_images_keep_their_size(tmp_path: Path) -> None:
    images = _noise_images(32)
    manifest = write_samples(tmp_path, 100, images)
    assert manifest["dir"] == "samples/step_0000100" and manifest["max_side"] == MAX_SIDE
    folder = tmp_path / "samples" / "step_0000100"
    assert sorted(p.name for p in folder.iterdir()) == sorted(e["file"] for e in manifest["files"])
    edit = next(e for e in manifest["files"] if e["kind"] == "edit" and e["index"] == 1)
    assert edit["caption"] == "a green circle" and edit["bytes"] == (folder / "edit_1.png").stat().st_size
    pixels = torch.from_numpy(np.array(Image.open(folder / "target_0.png"))).float()
    expected = (images["target"][0][1].permute(1, 2, 0) * 255 + 0.5).floor()
    assert torch.equal(pixels, expected)  # lossless at the original size


def test_every_evaluation_writes_samples_with_the_same_prompts_in_every_arm(tmp_path: Path) -> None:
    over = {"schedule": {"steps": 20, "checkpoint_every": 10}, "eval": {"num_samples": 4}}
    runs = {arm: list(train_arm(resolve(arm, deep_merge(QUICK, over)), tmp_path / arm)) for arm in "AB"}
    for arm, records in runs.items():
        assert [r["step"] for r in records] == [10, 20]
        for rec in records:
            manifest = rec["samples"]
            kinds = sorted({e["kind"] for e in manifest["files"]})
            assert kinds == ["caption", "edit", "recon", "target", "text"]
            for e in manifest["files"]:
                assert (tmp_path / arm / manifest["dir"] / e["file"]).stat().st_size == e["bytes"] > 0
            assert sum(e["bytes"] for e in manifest["files"]) <= BUDGET_BYTES
    a, b = runs["A"][-1]["samples"], runs["B"][-1]["samples"]
    assert [(e["file"], e["caption"]) for e in a["files"]] == [(e["file"], e["caption"]) for e in b["files"]]
    same = tmp_path / "A" / a["dir"] / "target_0.png", tmp_path / "B" / b["dir"] / "target_0.png"
    assert same[0].read_bytes() == same[1].read_bytes()  # the same held-out targets in every arm
    differ = tmp_path / "A" / a["dir"] / "text_0.png", tmp_path / "B" / b["dir"] / "text_0.png"
    assert differ[0].read_bytes() != differ[1].read_bytes()  # but each arm's own generations
