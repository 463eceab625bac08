"""Is an arm launch-bound at the micro-batch the trainer chose? GPU-busy time against step time (issue 27).

Builds the arm exactly as `worker.train.train_arm` does (`worker.train.build`: compile as the device's
default, the micro-batch given or found automatically), feeds it from the trainer's own loader, and runs
`worker.train.train_step` (every micro-batch's forward and backward, gradient accumulation, clipping, the
optimizer step, EMA). After `--warmup` steps it times `--steps` steps by wall clock, then profiles
`--profile-steps` more with torch.profiler and sums the CUDA kernel time per step (GPU-busy).

busy share = GPU-busy ms / step ms. A step whose GPU is busy for nearly all of its wall time gains at
most (1 - share) from CUDA graphs, which remove launch gaps and nothing else.

    python bench/launch_bound.py --arms B A --size seed --micro 32 16 --batch-mult 2   # GPU
    python bench/launch_bound.py --arms B --size tiny --device cpu --steps 2         # dry run
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import date
from pathlib import Path

import torch


def gpu_busy_ms(fn, n: int, device: torch.device) -> float | None:
    """Mean summed CUDA kernel time per call of fn() (ms); None off CUDA."""
    if device.type != "cuda":
        return None
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize(device)
    # Kernels only: user annotations on the GPU timeline (Optimizer.step#...) span idle gaps too.
    total_us = sum(
        e.self_device_time_total
        for e in prof.key_averages()
        if e.device_type == DeviceType.CUDA
        and not getattr(e, "is_user_annotation", False)
        and not e.key.startswith("Optimizer.")
    )
    return total_us / n / 1e3


def measure(arm: str, size: str, micro: int | None, batch_mult: int, device: torch.device, args) -> dict:
    from model.data.loader import StepBatches, make_loader
    from orchestrator.grids.arms import resolve
    from worker.train import IDENTITY_PROB, build, train_step

    over = {
        "model": {"size": size},
        "eval": {"lpips_backbone": "random_standin"},
        "repa": {"teacher": "random_standin"},
        "schedule": {"batch_size": 256},  # replaced below once the micro-batch is known
    }
    if size == "tiny":
        over["data"] = {"num_images": 256, "held_out": 4}
        over["eval"] = {"lpips_backbone": "random_standin", "num_samples": 4}
    spec = resolve(arm, over)
    parts = build(spec, device, None, micro_batch=micro)
    m = parts.micro_batch
    batch = m * batch_mult
    steps_total = args.warmup + args.steps + args.profile_steps
    spec = spec.model_copy(update={"schedule": spec.schedule.model_copy(update={"batch_size": batch})})
    parts.spec = spec
    batches = StepBatches(parts.dataset, batch, m, spec.data.seed + 1, IDENTITY_PROB)
    loader = iter(make_loader(batches, 0, steps_total, 4, pin=device.type == "cuda"))
    gen = torch.Generator(device=device).manual_seed(1)
    step = 0

    def one() -> None:
        nonlocal step
        train_step(parts, step, [next(loader) for _ in range(batch_mult)], gen)
        step += 1

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    t0 = time.perf_counter()
    for _ in range(args.warmup):
        one()
    sync()
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(args.steps):
        one()
    sync()
    step_ms = (time.perf_counter() - t0) / args.steps * 1e3
    busy = gpu_busy_ms(one, args.profile_steps, device) if args.profile_steps else None
    tokens = batch * (spec.resolution() // spec.model.dims().patch) ** 2
    return {
        "arm": arm,
        "size": size,
        "micro_batch": m,
        "micro_batch_how": parts.micro.how if parts.micro else None,
        "grad_accum": batch_mult,
        "batch": batch,
        "compiled": parts.compiled,
        "compile_mode": spec.precision.compile_mode,
        "warmup_s": round(warm_s, 1),
        "step_ms": round(step_ms, 2),
        "gpu_busy_ms": round(busy, 2) if busy is not None else None,
        "busy_share": round(busy / step_ms, 3) if busy is not None else None,
        "per_micro_batch_ms": round(step_ms / batch_mult, 2),
        "tokens_per_sec": round(tokens / (step_ms / 1e3)),
        "fallbacks": parts.fallbacks,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "date": date.today().isoformat(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arms", nargs="+", default=["B"])
    ap.add_argument("--size", default="seed")
    ap.add_argument("--micro", nargs="*", type=int, default=[], help="micro-batch per arm (default: auto)")
    ap.add_argument("--batch-mult", type=int, default=2, help="micro-batches per step (accumulation)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--profile-steps", type=int, default=2)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=None, help="append JSON lines here")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    for i, arm in enumerate(args.arms):
        micro = args.micro[i] if i < len(args.micro) else None
        row = measure(arm, args.size, micro, args.batch_mult, device, args)
        line = json.dumps(row, default=str)
        print(line, flush=True)
        if args.out:
            with args.out.open("a") as f:
                f.write(line + "\n")
        del row
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
