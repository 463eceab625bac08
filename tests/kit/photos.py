"""A small folder of captioned photos (random PNGs and their captions.jsonl), as a researcher's dataset
looks before `ablate data prepare`; SHARDS: what preparing it at 16 px with the tests' shard size makes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

SHARDS = ["shard-00000.npy", "shard-00001.npy"]


def photos(root: Path, n: int = 6) -> Path:
    root.mkdir(parents=True)
    lines = []
    for i in range(n):
        arr = np.random.default_rng(i).integers(0, 255, (30, 40, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, "PNG")
        (root / f"img{i}.png").write_bytes(buf.getvalue())
        lines.append(json.dumps({"file": f"img{i}.png", "caption": f"a photo number {i}"}))
    (root / "captions.jsonl").write_text("\n".join(lines))
    return root
