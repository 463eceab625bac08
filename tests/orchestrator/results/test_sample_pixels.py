"""A sample PNG is bounded by its pixels, not only its bytes: a few KB of zeros can claim 9,000 x 9,000
pixels, which the gallery's and the report's reader would decode, and a command arm's 64 pictures of
2048 x 2048 are 1.3 MiB as PNGs but 1 GiB decoded at once by W&B. Real PNGs in a real run folder on disk."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image

from orchestrator.db.models import Run
from orchestrator.results.samples import MAX_SAMPLE_SIDE, sample_png
from orchestrator.trackers.sample_images import MAX_PIXELS, OWN_MAX_SIDE, checkpoint_images
from worker.run_files import sample_dir
from worker.stored_file import StoredFileRefused

COMMAND_ARM = {"command": {"code": "/code", "argv": ["python", "train.py"]}}


def zeros_png(width: int, height: int) -> bytes:
    """A one-bit greyscale PNG of zeros: tiny on disk, width x height pixels once decoded."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = (b"\0" * (1 + (width + 7) // 8)) * height
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b"")


def flat_png(side: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGBA", (side, side), (1, 2, 3, 4)).save(out, format="PNG")
    return out.getvalue()


def run_with(folder: Path, pngs: dict[str, bytes]) -> Run:
    (folder / sample_dir(10)).mkdir(parents=True)
    for name, data in pngs.items():
        (folder / sample_dir(10) / name).write_bytes(data)
    return Run(id=1, arm="mine", spec=COMMAND_ARM, checkpoint_dir=str(folder), checkpoint_url=None)


@pytest.mark.parametrize("side", [9000, 14000])  # 14,000: over twice Pillow's MAX_IMAGE_PIXELS
def test_a_png_claiming_more_pixels_than_a_sample_has_is_not_served(tmp_path: Path, side: int) -> None:
    bomb = zeros_png(side, side)
    assert len(bomb) < 1 << 20, "a few hundred KB at most: the byte cap never sees it"
    run = run_with(tmp_path / "run", {"own_0.png": bomb, "own_1.png": flat_png(MAX_SAMPLE_SIDE)})
    with pytest.raises(StoredFileRefused, match=f"over the {MAX_SAMPLE_SIDE}-pixel side") as refused:
        sample_png(run, 10, "own_0.png", {})
    assert "/" not in refused.value.why
    assert sample_png(run, 10, "own_1.png", {}) == flat_png(MAX_SAMPLE_SIDE), "the largest side a sample has is served"


def test_a_checkpoint_s_images_reach_the_trackers_within_a_pixel_budget(tmp_path: Path) -> None:
    largest = flat_png(OWN_MAX_SIDE)
    pngs = {f"own_{i}.png": largest for i in range(64)}
    run = run_with(tmp_path / "run", pngs)
    manifest = {"samples": {"dir": sample_dir(10), "max_side": None, "files": [
        {"file": name, "kind": "own", "index": i, "caption": name, "bytes": len(png)}
        for i, (name, png) in enumerate(pngs.items())]}}  # fmt: skip
    out = checkpoint_images(run, 10, manifest, {})
    assert sum(Image.open(io.BytesIO(i.png)).size[0] ** 2 for i in out.images) <= MAX_PIXELS
    assert [i.name for i in out.images] == [f"own_{i}.png" for i in range(16)], "the first ones, in order"
    assert len(out.left_out) == 48 and all("million pixels" in why for why in out.left_out), out.left_out[:2]
