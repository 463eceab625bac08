"""The real trainer on one CUDA GPU with everything on: whole-model compile (optionally as CUDA graphs),
the compiled BatchedMuon step, EMA, REPA, AsymFlow and (arm I) FP8 with its speed recorded, then a stop
and a resume.

For each arm: train to step N/2 and stop through `should_stop` (as the controller's graceful stop
does), resume to N in a fresh `train_arm` call, and compare with an uninterrupted run to N: the
resumed losses, the final model weights (every tensor, bitwise), the micro-batch and compile in
effect, the fallbacks and the FP8 choice are printed. Not a CI test (needs a GPU).

The trainer's defaults apply unless a flag says otherwise: `precision.compile` unset (on for CUDA),
`schedule.micro_batch: auto` (the resume reuses the checkpoint's micro-batch). Pick --batch-size above
the micro-batch auto finds so the check covers gradient accumulation (seed size on an 80 GB GPU: A
finds 16, B 32, so --batch-size 64 accumulates 4 and 2).

    python bench/trainer_cuda_check.py --arms B A --size seed --steps 4 --batch-size 64
    python bench/trainer_cuda_check.py --arms G I --size small --steps 60
    python bench/trainer_cuda_check.py --arms I B --size tiny --steps 10 --compile-mode reduce-overhead
    python bench/trainer_cuda_check.py --arms B --size seed --steps 4 --batch-size 64 --control --deterministic
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from model.spec import ArmSpec
from worker.train import train_arm


def spec_for(
    arm: str, size: str, steps: int, compile: bool | None, compile_mode: str = "default", batch_size: int = 32,
    deterministic: bool = False,
) -> ArmSpec:
    """compile None: the trainer's default (on for CUDA). micro_batch stays auto."""
    from orchestrator.grids.arms import resolve  # a bench may use the controller's arm files

    precision: dict = {"compile_mode": compile_mode, "deterministic": deterministic}
    if compile is not None:
        precision["compile"] = compile
    overrides = {
        "model": {"size": size},
        "data": {"num_images": 2048, "held_out": 16},
        "schedule": {"steps": steps, "batch_size": batch_size, "warmup_steps": 5, "checkpoint_every": steps // 2,
                     "ema": {"warmup_steps": 5}},
        "eval": {"num_samples": 8, "sampler_steps": 10, "lpips_backbone": "random_standin"},
        "repa": {"teacher": "random_standin"},
        "precision": precision,
    }
    return resolve(arm, overrides)


def weights_equal(a: Path, b: Path) -> dict:
    """Compare the model and EMA tensors of two checkpoints bitwise: how many differ, the largest gap."""
    from worker import checkpoint as ckpt

    sa, sb = ckpt.load(a, map_location="cpu"), ckpt.load(b, map_location="cpu")
    differ, worst, count = [], 0.0, 0
    pairs = [("model", sa["model"], sb["model"])]
    pairs += [(f"ema.{k}", sa["ema"][k], sb["ema"][k]) for k in sa.get("ema", {})]
    for label, da, db in pairs:
        for name, ta in da.items():
            if not isinstance(ta, torch.Tensor):
                continue
            tb = db[name]
            count += 1
            if not torch.equal(ta, tb):
                differ.append(f"{label}.{name}")
                worst = max(worst, (ta.float() - tb.float()).abs().max().item())
    return {"tensors": count, "differ": len(differ), "first_differing": differ[:3], "max_abs_diff": worst}


def run(spec: ArmSpec, out: Path, device: str, stop_after: int | None = None) -> list[dict]:
    records = []
    state = {"step": 0}

    def should_stop() -> bool:
        return stop_after is not None and state["step"] >= stop_after

    for rec in train_arm(spec, out, device=device, should_stop=should_stop):
        state["step"] = rec["step"]
        records.append(rec)
    return records


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arms", nargs="+", default=["G", "I"])
    ap.add_argument("--size", default="small")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--device", default="cuda", help="cpu for a dry run of the script (no compile)")
    ap.add_argument("--compile-mode", default="default", choices=["default", "reduce-overhead"])
    ap.add_argument("--compile", default="auto", choices=["auto", "on", "off"], help="auto: the trainer's default")
    ap.add_argument("--batch-size", type=int, default=32, help="global batch (micro-batch: auto)")
    ap.add_argument("--deterministic", action="store_true",
                    help="precision.deterministic: deterministic kernels (needs a fresh process: cuBLAS's workspace)")
    ap.add_argument("--control", action="store_true",
                    help="also run the uninterrupted run a second time: how far two runs without a stop differ")
    args = ap.parse_args()
    compile = {"auto": None, "on": True, "off": False}[args.compile]
    for arm in args.arms:
        spec = spec_for(arm, args.size, args.steps, compile, args.compile_mode, args.batch_size, args.deterministic)
        root = Path(tempfile.mkdtemp(prefix=f"cuda-check-{arm}-"))
        t0 = time.monotonic()
        straight = run(spec, root / "straight", args.device)
        t1 = time.monotonic()
        first = run(spec, root / "resumed", args.device, stop_after=args.steps // 2)
        resumed = run(spec, root / "resumed", args.device)
        t2 = time.monotonic()
        keys = ("step", "train_loss", "recon_lpips", "samples_per_sec", "peak_memory_gb", "micro_batch",
                "grad_accum", "compiled", "compile_s")
        from worker import checkpoint as ckpt

        final_step = straight[-1]["step"]
        weights = weights_equal(ckpt.checkpoint_path(root / "straight", final_step),
                                ckpt.checkpoint_path(root / "resumed", final_step))
        print(json.dumps({
            "arm": arm,
            "uninterrupted": [{k: r.get(k) for k in keys} for r in straight],
            "stopped_then_resumed": [{k: r.get(k) for k in keys} for r in first + resumed],
            "final_loss_equal": straight[-1]["train_loss"] == resumed[-1]["train_loss"],
            "final_loss_abs_diff": abs(straight[-1]["train_loss"] - resumed[-1]["train_loss"]),
            "final_weights": weights,
            "micro_batch": straight[-1].get("micro_batch"),
            "micro_batch_how": straight[-1].get("micro_batch_how"),
            "micro_batch_after_resume": resumed[-1].get("micro_batch"),
            "compiled": straight[-1].get("compiled"),
            "fallbacks": straight[-1].get("fallbacks"),
            "fp8_linears": len(straight[-1].get("fp8_linears") or []),
            "fp8_linears_after_resume": len(resumed[-1].get("fp8_linears") or []),
            "fp8_autotune": straight[-1].get("fp8_autotune"),
            "compile_mode": args.compile_mode,
            "deterministic": straight[-1].get("deterministic"),
            "device": straight[-1].get("device_name"),
            "seconds": {"uninterrupted": round(t1 - t0, 1), "stop_and_resume": round(t2 - t1, 1)},
        }, default=str), flush=True)
        if args.control:  # the same run again, no stop: the GPU kernels' own run-to-run differences
            again = run(spec, root / "again", args.device)
            print(json.dumps({
                "arm": arm,
                "control": "uninterrupted twice",
                "final_loss_abs_diff": abs(straight[-1]["train_loss"] - again[-1]["train_loss"]),
                "final_weights": weights_equal(ckpt.checkpoint_path(root / "straight", final_step),
                                               ckpt.checkpoint_path(root / "again", final_step)),
            }), flush=True)


if __name__ == "__main__":
    main()
