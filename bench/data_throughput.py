"""The trainer fed from real images vs the procedural set, on one GPU at seed size (issue 26).

Makes a folder of photo-like JPEGs on the machine (smooth gradients, shapes and grain, quality 90),
prepares it into shards at the training resolution (`model.data.prepare`), then runs `train_arm` for
each arm and source with the trainer's defaults (micro_batch auto, compile on CUDA, loader workers
auto) and prints what the trainer records: tokens/s, data_wait_fraction, the micro-batch it chose,
the loader workers, and the loader processes' CPU time per image (cores needed = images/s x that).

    python bench/data_throughput.py --arms A B --sources shapes folder prepared --steps 8 --batch-size 64 \
        --images 1000 --out results.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import threading
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np


def make_photo(args: tuple[Path, int, int, int]) -> None:
    """A 'photo': a smooth two-colour gradient, a few soft shapes, and sensor-like grain, as a JPEG."""
    from PIL import Image, ImageDraw, ImageFilter

    root, i, w, h = args
    rng = np.random.default_rng(i)
    a, b = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    ramp = np.linspace(0, 1, h)[:, None, None]
    img = Image.fromarray((a * (1 - ramp) + b * ramp).repeat(w, axis=1).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(12):
        x, y, r = rng.integers(0, w), rng.integers(0, h), rng.integers(40, 400)
        fill = tuple(int(c) for c in rng.integers(0, 255, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x - r, y - r, x + r, y + r), fill=fill)
    img = img.filter(ImageFilter.GaussianBlur(3))
    grain = rng.normal(0, 6, (h, w, 3))
    arr = np.clip(np.asarray(img, dtype=np.float32) + grain, 0, 255).astype(np.uint8)
    Image.fromarray(arr).save(root / f"{i:05d}.jpg", quality=90)


def make_folder(root: Path, n: int, w: int, h: int) -> float:
    root.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    with Pool(os.cpu_count()) as pool:
        pool.map(make_photo, [(root, i, w, h) for i in range(n)], chunksize=8)
    colours = ["red", "green", "blue", "yellow", "purple", "orange"]
    lines = [json.dumps({"file_name": f"{i:05d}.jpg", "text": f"a {colours[i % 6]} photo {i}"}) for i in range(n)]
    (root / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    return time.perf_counter() - t


class LoaderCPU:
    """CPU seconds of this process's forked children that run the same program (the DataLoader's
    workers; Inductor's compile workers have their own command line and are left out)."""

    def __init__(self) -> None:
        self.me = Path("/proc/self/cmdline").read_bytes()
        self.seen: dict[int, float] = {}
        self.tick = os.sysconf("SC_CLK_TCK")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        me = os.getpid()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                stat = (proc / "stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
                if int(fields[1]) != me or (proc / "cmdline").read_bytes() != self.me:
                    continue
                self.seen[int(proc.name)] = (int(fields[11]) + int(fields[12])) / self.tick
            except (OSError, ValueError):
                continue

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self._sample()

    def __enter__(self) -> LoaderCPU:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def seconds(self) -> float:
        return sum(self.seen.values())


def run_one(
    arm: str, source: str, paths: dict[str, Path], steps: int, batch: int, out: Path, size: str, device: str
) -> dict:
    from model.spec import ArmSpec
    from worker.train import train_arm

    data: dict = {"held_out": 4}
    if source != "shapes":
        data |= {"dataset": "imagefolder" if source == "folder" else "prepared", "path": str(paths[source])}
    spec = ArmSpec.model_validate(
        {
            "name": arm,
            "model": {"size": size},
            "data": data,
            "tread": {"enabled": arm == "B"},
            "schedule": {"steps": steps, "batch_size": batch, "checkpoint_every": steps, "warmup_steps": 2},
            "eval": {"num_samples": 1, "sampler_steps": 1, "lpips_backbone": "random_standin"},
        }
    )
    t0 = time.perf_counter()
    with LoaderCPU() as cpu:
        records = list(train_arm(spec, out, device=device))
    rec = records[-1]
    timed_images = rec["samples_per_sec"]
    return {
        "arm": arm,
        "source": source,
        "tokens_per_sec": rec["tokens_per_sec"],
        "iter_per_sec": rec["iter_per_sec"],
        "data_wait_fraction": rec["data_wait_fraction"],
        "micro_batch": rec["micro_batch"],
        "grad_accum": rec["grad_accum"],
        "micro_batch_how": rec["micro_batch_how"],
        "loader_workers": rec["loader_workers"],
        "compile_s": rec["compile_s"],
        "peak_memory_gb": rec["peak_memory_gb"],
        "loader_cpu_s": cpu.seconds(),
        "loader_cpu_s_per_image": cpu.seconds() / (steps * batch),
        "loader_cores_at_this_speed": cpu.seconds() / (steps * batch) * timed_images if timed_images else None,
        "skipped_images": rec["skipped_images"],
        "fallbacks": rec["fallbacks"],
        "run_s": time.perf_counter() - t0,
        "device": rec["device_name"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", nargs="+", default=["A", "B"])
    ap.add_argument("--sources", nargs="+", default=["shapes", "folder", "prepared"])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--size", default="1536x1152", help="JPEG width x height")
    ap.add_argument("--model-size", default="seed", help="seed (the measurement) or tiny (a CPU smoke run)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "ablate-data-bench")
    ap.add_argument("--out", type=Path, default=Path("data_throughput.json"))
    args = ap.parse_args()

    import torch

    from model.data.loader import cpus_available
    from model.data.prepare import prepare
    from model.spec import SIZES

    w, h = (int(x) for x in args.size.split("x"))
    folder, prepared = args.work / "photos", args.work / "prepared"
    result: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "cpus": cpus_available(),
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "args": {k: str(v) for k, v in vars(args).items()},
        "runs": [],
    }
    if {"folder", "prepared"} & set(args.sources):
        if not (folder / "metadata.jsonl").is_file():
            result["jpeg_make_s"] = make_folder(folder, args.images, w, h)
        sizes = [p.stat().st_size for p in folder.glob("*.jpg")]
        result["jpeg"] = {"count": len(sizes), "mean_mb": float(np.mean(sizes)) / 1e6, "size": args.size}
    if "prepared" in args.sources:
        t = time.perf_counter()
        res = prepare(folder, prepared, SIZES[args.model_size].resolution)
        result["prepare"] = {
            "s": time.perf_counter() - t,
            "count": res.count,
            "shards": res.shards,
            "skipped": len(res.skipped),
        }
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}), flush=True)
    paths = {"folder": folder, "prepared": prepared}
    base: dict[str, float] = {}
    for arm in args.arms:
        for source in args.sources:
            work = args.work / f"run-{arm}-{source}"
            row = run_one(arm, source, paths, args.steps, args.batch_size, work, args.model_size, args.device)
            if source == "shapes":
                base[arm] = row["tokens_per_sec"]
            if arm in base and row["tokens_per_sec"]:
                row["vs_shapes"] = row["tokens_per_sec"] / base[arm]
            result["runs"].append(row)
            print(json.dumps(row), flush=True)
            args.out.write_text(json.dumps(result, indent=1))  # partial results survive a timeout
            if args.device == "cuda":
                torch.cuda.empty_cache()
    for r in result["runs"]:
        tps = r["tokens_per_sec"] or math.nan
        print(
            f"{r['arm']} {r['source']:9s} {tps:10.0f} tok/s  x{r.get('vs_shapes', math.nan):.2f}  "
            f"wait {r['data_wait_fraction']}  micro {r['micro_batch']}x{r['grad_accum']}  "
            f"workers {r['loader_workers']}  cores {r['loader_cores_at_this_speed']}"
        )


if __name__ == "__main__":
    main()
