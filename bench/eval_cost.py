"""What an evaluation costs beside the training it evaluates, at a size (issue 62: the deciding simulation prices
an image evaluated on a run at IMAGE_HOURS, 10 s per 64 images, and a seed at about 3.2 GPU-h; this checks the
first against a real run of the architecture, random-init, on the machine it runs on).

Arm A trains `--steps` steps with the trainer's own loop (`worker.train.train_arm`, compile off: a short run's
compile would swamp it), one checkpoint at the end, its in-training evaluation on `--train-images` held-out
images (the record's eval_time_s). Then that checkpoint is evaluated again as an evaluation job does
(`worker.evaluation.evaluate_arm`) on each of `--images`: each job's own time (the record's wall_time_s: the
checkpoint read, the parts built, the evaluation) and the evaluation alone. Writes a JSON and a Markdown table.
`--measures flow`: the jobs measure the flow loss alone (`evaluation["measures"]` = ["val_flow_loss"]), as a
deciding grid's look on `val_flow_ivw` asks (grids/deciding.py measures_of): none of the LPIPS metrics' sampling. The
in-training evaluation still measures every metric: on the same card, the full evaluation's price an image.

    python bench/eval_cost.py --size seed --steps 20 --batch 32 --images 64 256 --out DIR      # on a GPU
    python bench/eval_cost.py --size seed --steps 20 --batch 32 --images 64 256 1024 --measures flow --out DIR
    python bench/eval_cost.py --size tiny --steps 4 --batch 4 --images 8 16 --device cpu --out DIR   # dry run
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any


def spec_for(size: str, steps: int, batch: int, held_out: int, train_images: int, sampler_steps: int) -> Any:  # noqa: ANN401
    from orchestrator.grids.arms import resolve

    return resolve("A", {
        "model": {"size": size},
        "data": {"dataset": "shapes", "num_images": 4096, "held_out": held_out},
        "schedule": {"steps": steps, "batch_size": batch, "warmup_steps": 1, "checkpoint_every": steps},
        "precision": {"compile": False},
        # Offline machine: the labelled stand-in LPIPS; the cost of its network is LPIPS's at this size.
        "eval": {"lpips_backbone": "random_standin", "num_samples": train_images, "sampler_steps": sampler_steps},
    })  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="seed", choices=["tiny", "small", "seed"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--train-images", type=int, default=25, help="held-out images training evaluates (the default)")
    ap.add_argument("--images", type=int, nargs="+", default=[64, 256], help="images of each evaluation job")
    ap.add_argument("--sampler-steps", type=int, default=50, help="eval.sampler_steps (the default 50)")
    ap.add_argument("--measures", default="all", choices=["all", "flow"], help="what the jobs measure (flow: a look's)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    from worker.evaluation import LPIPS_KEYS, evaluate_arm
    from worker.train import train_arm

    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "work"
    spec = spec_for(args.size, args.steps, args.batch, max(args.images), args.train_images, args.sampler_steps)
    t0 = time.perf_counter()
    last: dict[str, Any] = {}
    for rec in train_arm(spec, work / "run", device=args.device):
        last = rec
    train_wall = time.perf_counter() - t0
    result: dict[str, Any] = {
        "size": args.size, "steps": args.steps, "batch": args.batch, "device": args.device,
        "sampler_steps": args.sampler_steps, "measures": args.measures, "train_wall_s": train_wall,
        "iter_per_sec": last.get("iter_per_sec"), "train_images": args.train_images,
        "train_eval_time_s": last.get("eval_time_s"), "jobs": [],
    }  # fmt: skip
    every = [*LPIPS_KEYS, "val_flow_loss"]  # grids/evaluations.py EVERY_METRIC; FLOW_METRICS is the last
    measures = every[-1:] if args.measures == "flow" else every
    for images in args.images:
        t1 = time.perf_counter()
        (rec,) = list(evaluate_arm(spec, work / f"eval-{images}", device=args.device,
                                   evaluation={"step": args.steps, "images": images, "measures": measures,
                                               "source_dir": str(work / "run")}))  # fmt: skip
        result["jobs"].append({"images": images, "job_s": time.perf_counter() - t1, "wall_time_s": rec["wall_time_s"],
                               "measured": sorted(k for k in rec if k in every),
                               "val_flow_loss": rec.get("val_flow_loss")})  # fmt: skip
        print(json.dumps(result["jobs"][-1]), flush=True)
    (args.out / "eval_cost.json").write_text(json.dumps(result, indent=2))
    lines = [f"eval_cost: {args.size}, {args.steps} steps at batch {args.batch} on {args.device}, "
             f"sampler_steps {args.sampler_steps}, jobs measure {args.measures}: {result['iter_per_sec']} it/s; "
             f"the in-training evaluation (every metric) of "
             f"{args.train_images} images {result['train_eval_time_s']:.2f} s", "",
             "| job images | job s (read, build, evaluate) | s per image |", "|---:|---:|---:|"]  # fmt: skip
    lines += [f"| {j['images']} | {j['job_s']:.2f} | {j['job_s'] / j['images']:.3f} |" for j in result["jobs"]]
    (args.out / "eval_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
