"""Sample images of one evaluation as PNG files beside the checkpoint's record.

Layout: out_dir/samples/step_{step:07d}/{kind}_{i}.png, kinds (model.evaluate keeps them):

    target   held-out image i          recon    generated from caption + identity tokens of target i
    text     generated from caption i only      caption / edit   the manipulation pair i, same noise

The record carries the manifest (`samples`: dir, files with kind, index, caption, bytes), so the
controller lists a checkpoint's images without reading the disk. Images are downscaled to at most
MAX_SIDE pixels (area averaging: dithering and noise stay visible as grey texture, not aliasing) and,
should a checkpoint's PNGs still exceed BUDGET_BYTES (incompressible noise from a broken arm), encoded
again at half the side until they fit.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from torch import Tensor

from worker.run_files import SAMPLE_KINDS, SAMPLE_MAX_SIDE, sample_dir

MAX_SIDE = SAMPLE_MAX_SIDE
BUDGET_BYTES = 400_000  # per checkpoint: a 5000-step run with 20 evaluations stays under 8 MB
MIN_SIDE = 16


def png_bytes(image: Tensor, max_side: int) -> bytes:
    """(3, H, W) in [0, 1] -> PNG, downscaled so the longer side is at most max_side."""
    array = (image.clamp(0, 1).permute(1, 2, 0).numpy() * 255 + 0.5).astype(np.uint8)
    pil = Image.fromarray(array)
    scale = max_side / max(pil.size)
    if scale < 1:
        pil = pil.resize((max(1, round(pil.width * scale)), max(1, round(pil.height * scale))), Image.Resampling.BOX)
    buf = io.BytesIO()
    pil.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def encode(images: dict[str, list[tuple[str, Tensor]]]) -> tuple[dict[str, bytes], list[dict[str, Any]], int]:
    """(file name -> PNG, manifest entries, side used), within BUDGET_BYTES."""
    side = MAX_SIDE
    while True:
        files: dict[str, bytes] = {}
        entries: list[dict[str, Any]] = []
        for kind in SAMPLE_KINDS:
            for i, (caption, image) in enumerate(images.get(kind, [])):
                name = f"{kind}_{i}.png"
                files[name] = png_bytes(image, side)
                entries.append({"file": name, "kind": kind, "index": i, "caption": caption, "bytes": len(files[name])})
        if sum(len(b) for b in files.values()) <= BUDGET_BYTES or side <= MIN_SIDE:
            return files, entries, side
        side //= 2


def write_samples(out_dir: Path, step: int, images: dict[str, list[tuple[str, Tensor]]]) -> dict[str, Any]:
    """Write the PNGs of checkpoint `step` (replacing a previous attempt's) and return the manifest."""
    folder = Path(out_dir) / sample_dir(step)
    folder.mkdir(parents=True, exist_ok=True)
    files, entries, side = encode(images)
    for name, data in files.items():
        tmp = folder / (name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, folder / name)  # a kill mid-write never leaves half a PNG under the real name
    return {"dir": sample_dir(step), "max_side": side, "files": entries}
