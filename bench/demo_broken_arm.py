"""The demo's broken arm (arms/demo.yaml `A-lr5e-2`) trained alone at several data seeds, each curve
replayed through the collapse detector with the arm's own policy (issue 16).

The arm is resolved exactly as `ablate demo` submits it (the grid file through `resolve_grid`), then
trained with `worker.train.train_arm` on one CPU thread, as a demo worker runs; only `data.seed`
changes between runs. One markdown row per seed: recon LPIPS ± SE per checkpoint up to the detector's
stop, the decision and its step, the best checkpoint kept.

    python bench/demo_broken_arm.py [--seeds 0 1 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch
import yaml

from arms import ARMS_DIR
from orchestrator.runs.arms import deep_merge
from orchestrator.runs.detector import Checkpoint, replay_arm
from orchestrator.runs.grids import GridCreate, resolve_grid
from worker.train import train_arm

BROKEN = "A-lr5e-2"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=None, help="run directories (default: a temp dir, removed)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    grid = yaml.safe_load((ARMS_DIR / "demo.yaml").read_text())
    spec = dict(resolve_grid(GridCreate(**grid)))[BROKEN]
    out = args.out or Path(tempfile.mkdtemp(prefix="demo-broken-"))
    print("| data seed | recon LPIPS ± SE per checkpoint (step: value) | detector | best kept | train s |")
    print("|---|---|---|---|---|")
    for seed in args.seeds:
        seeded = spec.model_validate(deep_merge(spec.model_dump(mode="json"), {"data": {"seed": seed}}))
        run_dir = out / f"seed{seed}"
        shutil.rmtree(run_dir, ignore_errors=True)
        t0 = time.perf_counter()
        records = list(train_arm(seeded, run_dir))
        seconds = time.perf_counter() - t0
        result = replay_arm(BROKEN, [Checkpoint.from_mapping(r) for r in records], seeded.detector)
        d = result.decision
        shown = [r for r in records if not result.stopped or r["step"] <= d.step]
        curve = ", ".join(f"{r['step']}: {r['recon_lpips']:.3f}±{r['recon_lpips_se']:.3f}" for r in shown)
        verdict = f"{d.kind.value} @{d.step}" if result.stopped else "ran to the end"
        print(f"| {seed} | {curve} | {verdict} | step {d.best_step} ({d.best_value:.3f}) | {seconds:.0f} |", flush=True)
    if args.out is None:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
