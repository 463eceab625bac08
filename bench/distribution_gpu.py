"""What one distribution pass costs a checkpoint on one GPU, and its share of a 5000-step night (issue 58 item 6).

The pass is worker/distribution.py's, timed in its parts with the product's own functions
(model/distribution_pass.py) on arm A's NanoDiT at random init (a trained one costs the same FLOPs):
- generate: `generate_samples` (held-out captions, the per-sample CPU noise of `sample_noise`, Euler steps at
  the worker's batch of 32, the copy back to the CPU) timed at 1 and `--time-steps` sampler steps on
  `--time-samples` samples; the slope is the seconds per sample per Euler step, the intercept what a sample
  costs whatever the steps (its noise, its held-out render, the copies). The pass at N samples is
  N x (intercept + slope x eval.distribution.sampler_steps);
- embed: `embed` through each extractor as the worker loads it with no weights on a GPU (model/extractors,
  `stand_in="architecture"`: a seeded random network of the real architecture, so the cost is real; fp32, as
  the Extractor runs), per image; `--tf32-also` times it with TF32 matmuls allowed too (not the product's setting);
- score: `score` for cmmd, dino_mmd and fd_dinov2 at N on CPU features of the real widths (768), as the worker
  scores them; it does not depend on the model size, so it is timed once;
- once per run or grid, apart: loading the two extractors; the reference features are `embed` on data.held_out
  images (the per-image rate above).
The night: `--night-steps` at the schedule's default cadence (checkpoint_every, distribution.every, and the
last; the best checkpoint is measured after the night), against (a) an eager training step of arm A timed here
(the trainer compiles: an upper bound on its step) and (b) the compiled step docs/benchmarks.md records (H100).

Partial results go to `--jsonl` line by line, so a call cut off still returns what was measured.
On the GPU machine: `bash bench/distribution_gpu.sh [args]`. CPU dry run (tiny size, small stand-in extractors):
    PYTHONPATH=. python bench/distribution_gpu.py --device cpu --sizes tiny --samples 64 256 --time-samples 16 \
        --time-steps 2 --extract-images 16 --train-micro tiny=4 --stand-in small --tf32-also
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from model.data import build_dataset
from model.distribution_pass import embed, generate_samples, score
from model.extractors import EXTRACTOR_FOR_METRIC, load_extractor
from model.flow import FlowMatching, interpolate, sample_t
from model.nanodit import NanoDiT
from model.precision import autocast_ctx
from model.spec import DistributionSpec, TrainingSchedule
from model.text import build_text_encoder
from orchestrator.grids.arms import resolve
from worker.distribution import EMBED_BATCH

# The compiled training step docs/benchmarks.md records for arm A at the default batch of 256, on one H100:
# seed 4.8 s (issue 27, "The trainer's defaults": 0.208 it/s); small 262,144 tokens at 1,107,111 tokens/s
# (issue 42, arm A small compiled at batch 64; the same tokens/s taken for batch 256).
DOCS_STEP_S = {"seed": 1 / 0.208, "small": 256 * 1024 / 1_107_111}
DOCS_CARD = "one H100 (docs/benchmarks.md: issue 27 seed, issue 42 small)"
METRICS = ("cmmd", "dino_mmd", "fd_dinov2")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def arm_spec(size: str, device: torch.device, held_out: int) -> Any:
    """Arm A at `size`; fp32 on a CPU as the trainer runs it there (worker/train_parts.py CPU_BF16_FALLBACK)."""
    cpu = {"precision": {"mode": "fp32"}} if device.type == "cpu" else {}
    data = {"dataset": "shapes", "num_images": 64, "held_out": held_out}
    return resolve("A", {"model": {"size": size}, "data": data, **cpu})


def time_generation(spec: Any, device: torch.device, samples: int, steps: int) -> tuple[dict[str, Any], torch.Tensor]:
    """generate_samples at 1 and `steps` Euler steps: seconds per sample per step (slope) and per sample (the
    rest), after a warm-up; and the generated images (for the extractors)."""
    dataset = build_dataset(spec)
    text_encoder = build_text_encoder(spec, dataset).to(device).eval()
    with torch.device(device):  # initialised on the device: seed size's CPU init takes seconds
        model = NanoDiT(spec, text_dim=text_encoder.dim).eval()
    flow = FlowMatching(spec.flow, spec.model.dims().patch, None)

    def run(n: int, k: int) -> torch.Tensor:
        return generate_samples(model, text_encoder, flow, dataset, n, k, spec.eval.seed, device, EMBED_BATCH,
                                lambda: autocast_ctx(spec.precision, device))  # fmt: skip

    timed(lambda: run(EMBED_BATCH, 1), device)
    one = min(timed(lambda: run(samples, 1), device)[1] for _ in range(2))  # the faster of two: less noise
    images, many = timed(lambda: run(samples, steps), device)
    many = min(many, timed(lambda: run(samples, steps), device)[1])
    slope = (many - one) / (samples * (steps - 1))
    return {"params_m": sum(p.numel() for p in model.parameters()) / 1e6, "resolution": spec.resolution(),
            "time_samples": samples, "time_steps": steps, "s_one_step": one, "s_many_steps": many,
            "s_per_sample_step": slope, "s_per_sample_fixed": max(one / samples - slope, 0.0)}, images  # fmt: skip


def time_training(spec: Any, device: torch.device, micro: int) -> dict[str, Any]:
    """An eager training step of arm A (bf16 autocast, flow loss, AdamW) at the default batch: `micro` images
    per forward/backward timed twice after a warm-up, times the accumulation, plus the optimizer's step."""
    dataset = build_dataset(spec)
    text_encoder = build_text_encoder(spec, dataset).to(device)
    with torch.device(device):
        model = NanoDiT(spec, text_dim=text_encoder.dim)
    flow = FlowMatching(spec.flow, spec.model.dims().patch, None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    images, captions = dataset.held_out(min(micro, spec.data.held_out))
    reps = math.ceil(micro / len(captions))
    x0 = images.repeat(reps, 1, 1, 1)[:micro].to(device)
    text, mask = text_encoder((captions * reps)[:micro])
    text, mask = text.detach().to(device), mask.to(device)

    def micro_step() -> None:
        eps = torch.randn_like(x0)
        t = sample_t(micro, spec.flow, device=device)
        with autocast_ctx(spec.precision, device):
            pred = model(interpolate(x0, eps, t), t, text, text_mask=mask, identity=None).out
        flow.loss(pred, x0, eps).backward()

    try:
        timed(micro_step, device)
        _, s = timed(lambda: (micro_step(), micro_step()), device)
        _, opt_s = timed(lambda: (opt.step(), opt.zero_grad(set_to_none=True)), device)
    except torch.OutOfMemoryError:
        return {"train": f"out of memory at micro-batch {micro}"}
    accum = spec.schedule.batch_size // micro
    return {"train_micro": micro, "train_accum": accum, "train_step_s_eager": accum * s / 2 + opt_s}


def time_extraction(ext: Any, args: argparse.Namespace, device: torch.device, images: torch.Tensor) -> dict:
    """Seconds to embed an image (the worker's `embed`, at its batch, from CPU images)."""
    x = images.repeat(math.ceil(args.extract_images / len(images)), 1, 1, 1)[: args.extract_images]
    feats, _ = timed(lambda: embed(ext, x[:EMBED_BATCH], EMBED_BATCH), device)  # warm-up
    _, s = timed(lambda: embed(ext, x, EMBED_BATCH), device)
    out = {"extractor": ext.label, "dim": int(feats.shape[1]), "s_per_image": s / len(x)}
    if args.tf32_also and device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            timed(lambda: embed(ext, x[:EMBED_BATCH], EMBED_BATCH), device)
            _, s = timed(lambda: embed(ext, x, EMBED_BATCH), device)
            out["s_per_image_tf32"] = s / len(x)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    return out


def time_scores(n: int, dim: int) -> dict[str, float]:
    """`score` of each metric at n generated samples against n reference rows of `dim` (CPU features, as the
    worker holds them; Gaussian rows, which CMMD normalises): the cost depends on n and dim alone."""
    g = torch.Generator().manual_seed(0)
    rows = {m: [torch.randn(n, dim, generator=g) for _ in range(2)] for m in METRICS}
    return {f"{m}_s": timed(lambda m=m: score(m, *rows[m], "bench"), torch.device("cpu"))[1] for m in METRICS}


def night_passes(steps: int, every_ckpt: int, every: int) -> int:
    """Passes in a night at the worker's cadence (DistributionPass.due): each every-th checkpoint and the last."""
    ckpts = steps // every_ckpt
    return len({k for k in range(1, ckpts + 1) if k % every == 0} | {ckpts})


# -- the bench -----------------------------------------------------------------------------------------------


def bench(args: argparse.Namespace, device: torch.device, emit: Callable[[dict], None]) -> None:
    """Generation at each size, then each extractor (loaded once) on each size's samples, the scores, and last
    the training steps (docs/benchmarks.md has the compiled ones): the pass's parts first if the call is cut."""
    specs = {size: arm_spec(size, device, max(args.time_samples, 64)) for size in args.sizes}
    images, dims = {}, []
    for size, spec in specs.items():
        gen, images[size] = time_generation(spec, device, args.time_samples, args.time_steps)
        emit({"size": size, "stage": "generation", **gen})
        free(device)
    for name in sorted(set(EXTRACTOR_FOR_METRIC.values())):
        ext, load_s = timed(lambda name=name: load_extractor(name, stand_in=args.stand_in, device=device), device)
        for size in args.sizes:
            row = time_extraction(ext, args, device, images[size])
            dims.append(row["dim"])
            emit({"size": size, "stage": f"embed {name}", "load_s": load_s, **row})
        del ext
        free(device)
    dim = dims[0] if dims else 768
    for n in args.samples:
        emit({"size": "-", "stage": f"score {n}", "n": n, "dim": dim, **time_scores(n, dim)})
    for size, spec in specs.items():
        micro = args.train_micro.get(size, 16)
        train = time_training(spec, device, micro)
        if "train" in train and micro > 1:  # out of memory: half the micro-batch, twice the accumulation
            free(device)
            train = {**time_training(spec, device, micro // 2), "first_try": train["train"]}
        emit({"size": size, "stage": "train", **train})
        free(device)


def pass_parts(by: dict[str, dict[str, Any]], n: int, steps: int) -> dict[str, float] | None:
    """Seconds of each part of one pass at n samples, from the emitted rows (None: not measured)."""
    gen = by.get("generation")
    if not gen:
        return None
    names = set(EXTRACTOR_FOR_METRIC.values())
    embeds = {name: by.get(f"embed {name}", {}).get("s_per_image", 0.0) * n for name in names}
    scores = by.get(f"score {n}", {})
    return {"generate": n * (gen["s_per_sample_fixed"] + gen["s_per_sample_step"] * steps),
            "clip": embeds[EXTRACTOR_FOR_METRIC["cmmd"]], "dino": embeds[EXTRACTOR_FOR_METRIC["fd_dinov2"]],
            "score": sum(scores.get(f"{m}_s", 0.0) for m in METRICS)}  # fmt: skip


def summary(rows: list[dict[str, Any]], args: argparse.Namespace, device_name: str) -> list[str]:
    """Seconds per pass at each N and the night's share, per size."""
    dist, every_ckpt = DistributionSpec(), TrainingSchedule().checkpoint_every
    passes = night_passes(args.night_steps, every_ckpt, dist.every)
    out = [f"A pass: eval.distribution's defaults (sampler_steps {dist.sampler_steps}, every {dist.every}); a "
           f"{args.night_steps}-step night checkpoints every {every_ckpt} steps: {passes} passes.", "",
           "| size | N | generate s | CLIP L/14-336 s | DINOv2 B/14 s | score s (CPU) | pass s | a night's passes s | "
           "night's training s: eager here / compiled (docs) | passes / training: eager / docs |",
           "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    scores = {r["stage"]: r for r in rows if r["size"] == "-"}
    tail: list[str] = []
    for size in args.sizes:
        by = {r["stage"]: r for r in rows if r["size"] == size} | scores
        step_s = (by.get("train", {}).get("train_step_s_eager"), DOCS_STEP_S.get(size))
        train = [x * args.night_steps if x else None for x in step_s]
        for n in args.samples:
            parts = pass_parts(by, n, dist.sampler_steps)
            if parts is None:
                out.append(f"| {size} | {n} | (not measured) |")
                continue
            one = sum(parts.values())
            cells = " | ".join(f"{parts[k]:.1f}" for k in ("generate", "clip", "dino", "score"))
            walls = " / ".join(f"{t:.0f}" if t else "-" for t in train)
            share = " / ".join(f"{passes * one / t:.1%}" if t else "-" for t in train)
            out.append(f"| {size} | {n} | {cells} | {one:.1f} | {passes * one:.0f} | {walls} | {share} |")
        for name in sorted(set(EXTRACTOR_FOR_METRIC.values())):
            e = by.get(f"embed {name}", {})
            if e:
                tf32 = f", with TF32 {e['s_per_image_tf32'] * 1e3:.2f} ms" if "s_per_image_tf32" in e else ""
                tail.append(f"- {size}: {e['extractor']}: {e['s_per_image'] * 1e3:.2f} ms an image{tf32}; "
                            f"loaded in {e['load_s']:.1f} s (once a run)")  # fmt: skip
    return [*out, "", f"Pass on {device_name}; the compiled night from {DOCS_CARD}. generate includes the CPU noise "
            "and copies (generate_samples); score runs on the CPU, as the worker's does.", *tail]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sizes", nargs="+", default=["small", "seed"], choices=["tiny", "small", "seed"])
    ap.add_argument("--samples", nargs="+", type=int, default=[2000, 10000])
    ap.add_argument("--time-samples", type=int, default=64, help="samples generated per timing")
    ap.add_argument("--time-steps", type=int, default=6, help="Euler steps of the longer timing")
    ap.add_argument("--extract-images", type=int, default=256, help="images timed through each extractor")
    ap.add_argument("--train-micro", type=lambda s: dict(kv.split("=") for kv in s.split(",")),
                    default={"small": "64", "seed": "16", "tiny": "64"}, help="e.g. small=64,seed=16")  # fmt: skip
    ap.add_argument("--tf32-also", action="store_true", help="time the extractors with TF32 matmuls too")
    ap.add_argument("--stand-in", default="architecture", choices=["architecture", "small"])
    ap.add_argument("--night-steps", type=int, default=5000)
    ap.add_argument("--jsonl", type=Path, default=None, help="each measurement as it comes")
    ap.add_argument("--out", type=Path, default=None, help="the summary (markdown)")
    args = ap.parse_args()
    args.train_micro = {k: int(v) for k, v in args.train_micro.items()}
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    rows: list[dict[str, Any]] = []
    head = [f"`python bench/distribution_gpu.py {' '.join(sys.argv[1:])}`, {datetime.now():%Y-%m-%d %H:%M}, {name}, "
            f"torch {torch.__version__}", ""]  # fmt: skip

    def emit(row: dict[str, Any]) -> None:
        row = {**row, "t": round(time.monotonic() - t0, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.jsonl:
            with args.jsonl.open("a") as f:
                f.write(json.dumps(row) + "\n")

    t0 = time.monotonic()
    try:
        bench(args, device, emit)
    finally:
        text = "\n".join([*head, *summary(rows, args, name), "", f"wall {time.monotonic() - t0:.0f} s"])
        print(text, flush=True)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
