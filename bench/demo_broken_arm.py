"""The demo's broken arm (arms/demo.yaml `A-lr500x`) trained alone, case by case, each curve judged
checkpoint by checkpoint by the collapse detector with the arm's own policy (issues 16 and 22).

The arm is resolved exactly as `ablate demo` submits it (the grid file through `resolve_grid`), then
trained with `worker.train.train_arm`, as a demo worker runs it. A case is (data seed, torch threads,
deterministic algorithms on/off); only `data.seed` changes the spec. Training ends where the detector
stops the arm, as in the demo, so a stopped case costs only the steps up to its stop. One markdown row
per case: recon LPIPS ± SE and train loss per checkpoint up to the stop, the decision and its step, the
best checkpoint kept; then a summary line (how many cases stopped, the range of stop steps).

Threads come from OMP_NUM_THREADS (1 when unset, as a Ray demo worker with num_cpus=0 runs); run one
process per thread count:

    for t in 1 2; do OMP_NUM_THREADS=$t python bench/demo_broken_arm.py --seeds 0 1 2 3 4 --deterministic both; done

--set section.field=value (YAML value) changes the arm for exploring other broken arms; the rows say so.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from arms import ARMS_DIR
from model.spec import ArmSpec
from orchestrator.grids.arms import deep_merge
from orchestrator.grids.service import GridCreate, resolve_grid
from orchestrator.runs.detector import Checkpoint, Decision, decide
from worker.train import train_arm

BROKEN = "A-lr500x"


def _override(dotted: str) -> dict[str, Any]:
    """`schedule.lr=0.3` -> {"schedule": {"lr": 0.3}} (the value parsed as YAML)."""
    key, sep, value = dotted.partition("=")
    if not sep or not key:
        raise SystemExit(f"--set expects section.field=value, got {dotted!r}")
    out: dict[str, Any] = {}
    node = out
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = yaml.safe_load(value)
    return out


def run_case(spec: ArmSpec, run_dir: Path) -> tuple[list[dict[str, Any]], Decision, int | None, float]:
    """Train until the detector stops the arm or its last step.

    Returns (records, last decision, first step whose train loss was not finite or None, seconds).
    """
    shutil.rmtree(run_dir, ignore_errors=True)
    t0 = time.perf_counter()
    records: list[dict[str, Any]] = []
    series: list[Checkpoint] = []
    decision: Decision | None = None
    first_nonfinite: list[int] = []

    def on_step(step: int, loss: float) -> None:  # a sync per step: cheap on CPU, and shows where it broke
        if not first_nonfinite and not math.isfinite(loss):
            first_nonfinite.append(step)

    for record in train_arm(spec, run_dir, on_step=on_step):
        records.append(record)
        series.append(Checkpoint.from_mapping(record))
        decision = decide(series, spec.detector, total_steps=spec.schedule.steps)
        if decision.stop:
            break  # closing the generator ends training here, as the demo's launcher stops the worker
    assert decision is not None
    return records, decision, (first_nonfinite or [None])[0], time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--deterministic", choices=["off", "on", "both"], default="off",
                        help="torch.use_deterministic_algorithms for each case (both: off, then on)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="change the arm (exploring); repeatable")
    parser.add_argument("--out", type=Path, default=None, help="run directories (default: a temp dir, removed)")
    args = parser.parse_args()
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)
    grid = yaml.safe_load((ARMS_DIR / "demo.yaml").read_text())
    spec = dict(resolve_grid(GridCreate(**grid)))[BROKEN]
    changes: dict[str, Any] = {}
    for dotted in args.sets:
        changes = deep_merge(changes, _override(dotted))
    if changes:
        spec = spec.model_validate(deep_merge(spec.model_dump(mode="json"), changes))
        print(f"arm changed: {changes}")
    s = spec.schedule
    print(f"{BROKEN}: lr {s.lr:g} ({s.lr_schedule}, warm-up {s.warmup_steps}, min {s.min_lr:g}), "
          f"grad clip {spec.optimizer.grad_clip:g}, {s.steps} steps, checkpoint every {s.checkpoint_every}; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    out = args.out or Path(tempfile.mkdtemp(prefix="demo-broken-"))
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.deterministic]
    print("| data seed | threads | deterministic | recon LPIPS ± SE (train loss) per checkpoint, step: value "
          "| detector | best kept | train s |")
    print("|---|---|---|---|---|---|---|")
    stops: list[int | None] = []
    for det in modes:
        torch.use_deterministic_algorithms(det)
        for seed in args.seeds:
            seeded = spec.model_validate(deep_merge(spec.model_dump(mode="json"), {"data": {"seed": seed}}))
            records, d, nonfinite, seconds = run_case(seeded, out / f"seed{seed}-t{threads}-det{int(det)}")
            curve = ", ".join(
                f"{r['step']}: {r['recon_lpips']:.3f}±{r['recon_lpips_se']:.3f} ({r['train_loss']:.3f})"
                for r in records
            )
            verdict = f"{d.kind.value} @{d.step}" if d.stop else "ran to the end"
            if nonfinite is not None:
                verdict += f" (loss non-finite from step {nonfinite})"
            stops.append(d.step if d.stop else None)
            print(f"| {seed} | {threads} | {'on' if det else 'off'} | {curve} | {verdict} "
                  f"| step {d.best_step} ({d.best_value:.3f}) | {seconds:.0f} |", flush=True)
    torch.use_deterministic_algorithms(False)
    stopped = [st for st in stops if st is not None]
    span = f", at steps {min(stopped)}-{max(stopped)}" if stopped else ""
    print(f"\nstopped {len(stopped)} of {len(stops)} cases{span}")
    if args.out is None:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
