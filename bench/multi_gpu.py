"""An arm on two GPUs against one (issue 42), and the compile cache cold against stored.

`ddp`: the same arm at the same global batch, trained by the trainer itself: once on one GPU (in this
process, as a one-GPU worker does) and once data-parallel on N GPUs (worker/ranks.py, as a worker with
`gpus: N` does). The one-GPU run takes the whole batch per micro-batch and each rank its 1/N of it, so
both draw the same data and noise micro-batch by micro-batch; what differs is bf16 arithmetic, kernel
choice and the all-reduce's summation order. Prints and writes per checkpoint train_loss and
val_flow_loss of both with their relative difference, and the steady-state tokens/s of both (the
trainer's own records: compile and evaluation excluded) with the speed-up.

`compile`: a compiled arm in a fresh process with an empty node cache, twice, against one store
(worker/compile_cache.py): the first compiles cold and stores its artefacts, the second loads them
before its first step. Prints each run's compile_s and compile_cache.

    python bench/multi_gpu.py ddp --arm A --size small --batch 64 --steps 60 --every 30 --gpus 2 --out DIR
    python bench/multi_gpu.py compile --arm A --size seed --out DIR
Dry run on CPU (gloo):
    PYTHONPATH=. python bench/multi_gpu.py ddp --size tiny --batch 8 --steps 12 --every 6 --device cpu
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

KEEP = ("step", "train_loss", "val_flow_loss", "val_flow_loss_se", "tokens_per_sec", "iter_per_sec", "micro_batch",
        "grad_accum", "ranks", "compiled", "compile_s", "peak_memory_gb", "data_wait_fraction", "device_name")


def arm_spec(args: argparse.Namespace, gpus: int, **over: Any) -> Any:  # noqa: ANN401 - model.spec.ArmSpec
    from orchestrator.grids.arms import deep_merge, resolve

    return resolve(args.arm, deep_merge({
        "model": {"size": args.size},
        "data": {"dataset": "shapes", "num_images": 4096, "held_out": 32},
        # the one-GPU run's micro-batch is the whole batch, each rank's is its share: the same draws
        "schedule": {"steps": args.steps, "batch_size": args.batch, "micro_batch": args.batch // gpus,
                     "warmup_steps": max(1, args.steps // 10), "checkpoint_every": args.every},
        "eval": {"num_samples": 16, "sampler_steps": 20, "lpips_backbone": "random_standin"},
        "gpus": gpus,
    }, over))


def ddp(args: argparse.Namespace) -> dict[str, Any]:
    if args.device == "cuda" and not os.environ.get("CUDA_VISIBLE_DEVICES"):
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(args.gpus))  # the ranks' GPUs
    import torch

    from worker.ranks import new_job, run_ranks
    from worker.train import train_arm

    work = Path(tempfile.mkdtemp(prefix="multi-gpu-"))
    t0 = time.perf_counter()
    one = [{k: r.get(k) for k in KEEP} for r in train_arm(arm_spec(args, 1), work / "one", device=args.device)]
    print(f"1 GPU: {time.perf_counter() - t0:.0f} s", json.dumps(one[-1]), flush=True)
    if args.device == "cuda":
        torch.cuda.empty_cache()
    spec = arm_spec(args, args.gpus)
    job = new_job(work / "many", args.gpus, spec=spec.model_dump(mode="json"), lpips_weights=None, data_store=None,
                  torch_threads=1 if args.device == "cpu" else 0, train_fn="worker.train:train_arm")
    t0 = time.perf_counter()
    many = [{k: r.get(k) for k in KEEP} for r in run_ranks(job, lambda: False)]
    print(f"{args.gpus} GPUs: {time.perf_counter() - t0:.0f} s", json.dumps(many[-1]), flush=True)
    rows = []
    for a, b in zip(many, one, strict=True):
        row = {"step": a["step"]}
        for k in ("train_loss", "val_flow_loss"):
            row[k] = {"1": b[k], str(args.gpus): a[k], "rel_diff": abs(a[k] - b[k]) / abs(b[k])}
        rows.append(row)
        print(json.dumps(row))
    speedup = many[-1]["tokens_per_sec"] / one[-1]["tokens_per_sec"]
    print(f"tokens/s: 1 GPU {one[-1]['tokens_per_sec']:,.0f}, {args.gpus} GPUs {many[-1]['tokens_per_sec']:,.0f}: "
          f"{speedup:.3f}x ({speedup / args.gpus:.1%} scaling)")
    return {"arm": args.arm, "size": args.size, "batch": args.batch, "steps": args.steps, "gpus": args.gpus,
            "one": one, "many": many, "by_checkpoint": rows, "speedup": speedup}


# One compiled run in a fresh process: argv = spec JSON, out dir, compile cache JSON; prints the last record.
FRESH = """
import json, sys
from model.spec import ArmSpec
from worker.train import train_arm
spec, out, cache = ArmSpec.model_validate(json.loads(sys.argv[1])), sys.argv[2], json.loads(sys.argv[3])
print(json.dumps(list(train_arm(spec, out, device=sys.argv[4], compile_cache=cache))[-1], default=str))
"""


def compile_runs(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="compile-cache-"))
    # steps past WARMUP_STEPS: the forward, backward and optimizer step have all compiled by then
    spec = arm_spec(args, 1, precision={"compile": True},
                    schedule={"steps": 4, "checkpoint_every": 4, "batch_size": args.micro, "micro_batch": args.micro})
    store = f"file://{work / 'store'}"
    runs = {}
    # the project first, then whatever the caller's PYTHONPATH held (the carried wheels' site)
    path = os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))
    for name in ("cold", "stored"):
        cache = {"dir": str(work / f"node-{name}"), "url": store}  # an empty node cache each time
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", FRESH, spec.model_dump_json(), str(work / f"run-{name}"), json.dumps(cache),
             args.device], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path},
        )
        if out.returncode:
            print(out.stderr[-4000:])
            raise SystemExit(f"the {name} run failed")
        rec = json.loads(out.stdout.strip().splitlines()[-1])
        runs[name] = {"compile_s": rec.get("compile_s"), "compile_cache": rec.get("compile_cache"),
                      "process_s": time.perf_counter() - t0, "device_name": rec.get("device_name")}
        print(name, json.dumps(runs[name]), flush=True)
    return {"arm": args.arm, "size": args.size, "micro_batch": args.micro, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["ddp", "compile"])
    parser.add_argument("--arm", default="A")
    parser.add_argument("--size", default="small", choices=["seed", "small", "tiny"])
    parser.add_argument("--batch", type=int, default=64, help="the global batch (ddp)")
    parser.add_argument("--micro", type=int, default=4, help="the batch of the compiled runs (compile)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=30)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=None, help="a directory for <what>.json")
    args = parser.parse_args()
    result = ddp(args) if args.what == "ddp" else compile_runs(args)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"multi_gpu_{args.what}_{args.arm}_{args.size}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
