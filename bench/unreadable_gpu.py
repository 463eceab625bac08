"""Unreadable photos on a GPU (issue 32): a folder with 0.5% unreadable files trains, naming them on the
run; at 2% the run fails naming the first ten. Both decode paths: the whole folder decoded at start (within
the cache cap) and per batch by loader worker processes (cache cap 0).

    python bench/unreadable_gpu.py --device cuda [--size small --steps 40]

Prints one JSON line per case: its share of unreadable files, how it ended, the files the run named.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import model.data.captioned as captioned  # noqa: E402
from orchestrator.grids.arms import resolve  # noqa: E402
from worker.train import train_arm  # noqa: E402


def folder(root: Path, good: int, bad: int, side: int) -> Path:
    """`good` photo-like PNGs and `bad` unreadable files (empty, or a JPEG header and nothing after it)."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    names = []
    for i in range(good):
        Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(root / f"p{i:04d}.png")
        names.append(f"p{i:04d}.png")
    for j in range(bad):
        (root / f"bad{j:02d}.jpg").write_bytes(b"" if j % 2 == 0 else b"\xff\xd8\xff\xe0 cut short")
        names.append(f"bad{j:02d}.jpg")
    order = rng.permutation(len(names))
    lines = [json.dumps({"file": names[k], "caption": f"a photo number {k}"}) for k in order]
    (root / "captions.jsonl").write_text("\n".join(lines))
    return root


def case(work: Path, label: str, good: int, bad: int, args: argparse.Namespace, per_batch: bool) -> dict:
    captioned.CACHE_BYTES = 0 if per_batch else 1 << 30  # per batch in loader workers, or all at start
    root = folder(work / label, good, bad, args.side)
    spec = resolve("A", {
        "model": {"size": args.size},
        "data": {"dataset": "imagefolder", "path": str(root), "held_out": 4},
        "schedule": {"steps": args.steps, "batch_size": 16, "warmup_steps": 2, "checkpoint_every": args.steps},
        "eval": {"num_samples": 4, "sampler_steps": 4, "lpips_backbone": "random_standin"},
    })  # fmt: skip
    t0 = time.perf_counter()
    try:
        records = list(train_arm(spec, work / f"{label}-run", device=args.device))
        last = records[-1]
        named = [f for f in last.get("fallbacks", []) if "unreadable" in f]
        return {"case": label, "share": bad / (good + bad), "ended": f"trained {last['step']} steps",
                "skipped_images": last.get("skipped_images"), "named": named, "s": round(time.perf_counter() - t0, 1)}
    except Exception as exc:  # noqa: BLE001 - the run's failure is the result
        return {"case": label, "share": bad / (good + bad), "ended": f"failed: {type(exc).__name__}",
                "error": str(exc)[:1500], "s": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--side", type=int, default=96, help="side of the generated photos, px")
    args = ap.parse_args()
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    print(json.dumps({"device": args.device, "gpu": gpu, "torch": torch.__version__, "size": args.size,
                      "steps": args.steps}), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for per_batch in (False, True):
            how = "per-batch" if per_batch else "at-start"
            print(json.dumps(case(work, f"half-percent-{how}", 398, 2, args, per_batch)), flush=True)
            print(json.dumps(case(work, f"two-percent-{how}", 196, 4, args, per_batch)), flush=True)


if __name__ == "__main__":
    main()
