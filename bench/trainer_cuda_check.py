"""The real trainer on one CUDA GPU with everything on: whole-model compile (optionally as CUDA graphs),
the compiled BatchedMuon step, EMA, REPA, AsymFlow and (arm I) FP8 with its speed recorded, then a stop
and a resume.

For each arm: train to step N/2 and stop through `should_stop` (as the controller's graceful stop
does), resume to N in a fresh `train_arm` call, and compare with an uninterrupted run to N: the
resumed losses, the fallbacks and the FP8 choice are printed. Not a CI test (needs a GPU).

    python bench/trainer_cuda_check.py --arms G I --size small --steps 60
    python bench/trainer_cuda_check.py --arms I B --size tiny --steps 10 --compile-mode reduce-overhead
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from model.spec import ArmSpec
from worker.train import train_arm


def spec_for(arm: str, size: str, steps: int, compile: bool, compile_mode: str = "default") -> ArmSpec:
    from orchestrator.runs.arms import resolve  # a bench may use the controller's arm files

    overrides = {
        "model": {"size": size},
        "data": {"num_images": 2048, "held_out": 16},
        "schedule": {"steps": steps, "batch_size": 32, "warmup_steps": 5, "checkpoint_every": steps // 2,
                     "ema": {"warmup_steps": 5}},
        "eval": {"num_samples": 8, "sampler_steps": 10, "lpips_backbone": "random_standin"},
        "repa": {"teacher": "random_standin"},
        "precision": {"compile": compile, "compile_mode": compile_mode},
    }
    return resolve(arm, overrides)


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
    args = ap.parse_args()
    for arm in args.arms:
        spec = spec_for(arm, args.size, args.steps, compile=args.device != "cpu", compile_mode=args.compile_mode)
        root = Path(tempfile.mkdtemp(prefix=f"cuda-check-{arm}-"))
        t0 = time.monotonic()
        straight = run(spec, root / "straight", args.device)
        t1 = time.monotonic()
        first = run(spec, root / "resumed", args.device, stop_after=args.steps // 2)
        resumed = run(spec, root / "resumed", args.device)
        t2 = time.monotonic()
        keys = ("step", "train_loss", "recon_lpips", "samples_per_sec", "peak_memory_gb")
        print(json.dumps({
            "arm": arm,
            "uninterrupted": [{k: r.get(k) for k in keys} for r in straight],
            "stopped_then_resumed": [{k: r.get(k) for k in keys} for r in first + resumed],
            "final_loss_equal": straight[-1]["train_loss"] == resumed[-1]["train_loss"],
            "final_loss_abs_diff": abs(straight[-1]["train_loss"] - resumed[-1]["train_loss"]),
            "fallbacks": straight[-1].get("fallbacks"),
            "fp8_linears": len(straight[-1].get("fp8_linears") or []),
            "fp8_linears_after_resume": len(resumed[-1].get("fp8_linears") or []),
            "fp8_autotune": straight[-1].get("fp8_autotune"),
            "compile_mode": args.compile_mode,
            "device": straight[-1].get("device_name"),
            "seconds": {"uninterrupted": round(t1 - t0, 1), "stop_and_resume": round(t2 - t1, 1)},
        }, default=str), flush=True)


if __name__ == "__main__":
    main()
