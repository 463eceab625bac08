"""val_flow_loss against a known-worse arm on one GPU (issue 33, item 3): arm A and A with its learning rate
/10, same data, seeds and held-out images, two processes at once on the one GPU.

Each process trains one arm with `worker.train.train_arm` (the trainer's defaults) and writes its records
to OUT/flow_<arm>.jsonl as they come: val_flow_loss with its per-image values and per-time means, and the
stand-in recon LPIPS with its per-sample values, both on the same 64 held-out images. Each record also
carries the whole (image x time) loss grid (`val_flow_grid`), so the report can set the grid estimator
(every image at all 8 times) against MLPerf's (image i at time i mod 8 only) on the same cells.
`--report` pairs the arms at every checkpoint with `orchestrator.results.reports.stats.difference` and names
the first step whose 95% interval excludes zero, for each metric.

    python bench/val_flow_loss.py --arm A --out DIR & python bench/val_flow_loss.py --arm A-lr10 --out DIR; wait
    python bench/val_flow_loss.py --report --out DIR
    python bench/val_flow_loss.py --arm A --size tiny --device cpu --steps 40 --every 20 --out DIR   # dry run
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

ARMS = {"A": 1.0, "A-lr10": 0.1}  # learning-rate factor against A's


def spec_for(arm: str, size: str, steps: int, every: int, batch: int, n: int, sampler_steps: int):
    from orchestrator.grids.arms import resolve

    base = resolve("A", {"model": {"size": size}})
    return resolve("A", {
        "model": {"size": size},
        "data": {"dataset": "shapes", "num_images": 4096, "held_out": n},
        "schedule": {"steps": steps, "batch_size": batch, "warmup_steps": max(1, steps // 10),
                     "lr": base.schedule.lr * ARMS[arm], "checkpoint_every": every,
                     "ema": {"warmup_steps": max(1, steps // 10)}},
        # Offline machine: the labelled stand-in LPIPS (what this metric replaces as the judge).
        "eval": {"lpips_backbone": "random_standin", "num_samples": n, "sampler_steps": sampler_steps},
    })  # fmt: skip


def train(args: argparse.Namespace) -> None:
    import model.evaluate as ev
    from worker.train import train_arm

    grids: list[Any] = []
    plain = ev.flow_loss_grid

    def keep(*a: Any, **k: Any) -> Any:  # the bench keeps each evaluation's whole grid
        grid = plain(*a, **k)
        grids.append(grid)
        return grid

    ev.flow_loss_grid = keep
    spec = spec_for(args.arm, args.size, args.steps, args.every, args.batch, args.n, args.sampler_steps)
    t0 = time.monotonic()
    path = args.out / f"flow_{args.arm}.jsonl"
    path.unlink(missing_ok=True)
    run_dir = args.work / f"run-{args.arm}"
    for rec in train_arm(spec, run_dir, device=args.device,
                         should_stop=lambda: time.monotonic() - t0 > args.deadline_s):  # fmt: skip
        keys = ("step", "train_loss", "lr", "iter_per_sec", "eval_time_s", "eval_weights", "lpips_backbone",
                "val_flow_definition", "val_flow_loss_t")
        row = {k: rec.get(k) for k in keys}
        for m in ("val_flow_loss", "recon_lpips"):
            row.update({k: rec.get(k) for k in (m, f"{m}_se", f"{m}_n", f"{m}_samples")})
        row["val_flow_loss_by_t"] = rec.get("val_flow_loss_by_t")
        row["val_flow_grid"] = grids[-1].tolist()
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(args.arm, json.dumps({k: row[k] for k in ("step", "train_loss", "val_flow_loss", "val_flow_loss_se",
                                                        "recon_lpips", "iter_per_sec")}), flush=True)  # fmt: skip


def estimators(grid: list[list[float]]) -> dict[str, float]:
    """The grid's mean and per-image SE, and MLPerf's on the same cells (image i at time i mod K only):
    the mean of the K per-time means, SE from the per-time SEs."""
    n, k = len(grid), len(grid[0])
    per_image = [sum(r) / k for r in grid]
    mean = sum(per_image) / n
    se_grid = math.sqrt(sum((x - mean) ** 2 for x in per_image) / (n - 1) / n)
    by_t: list[list[float]] = [[] for _ in range(k)]
    for i, row in enumerate(grid):
        by_t[i % k].append(row[i % k])
    means = [sum(v) / len(v) for v in by_t]
    var = [sum((x - m) ** 2 for x in v) / (len(v) - 1) / len(v) for v, m in zip(by_t, means, strict=True)]
    return {"grid_mean": mean, "grid_se": se_grid, "mlperf_mean": sum(means) / k,
            "mlperf_se": math.sqrt(sum(var)) / k}  # fmt: skip


def report(args: argparse.Namespace) -> None:
    from orchestrator.db.models import Metric
    from orchestrator.results.reports.stats import difference
    from orchestrator.runs.ingest import metric_values

    runs = {arm: [json.loads(x) for x in (args.out / f"flow_{arm}.jsonl").read_text().splitlines()] for arm in ARMS}
    worse = {r["step"]: r for r in runs["A-lr10"]}
    first: dict[str, int | None] = {"val_flow_loss": None, "recon_lpips": None}
    lines = ["| step | A loss | A val_flow_loss ± SE | A-lr10 val_flow_loss | A-lr10 − A flow [95% CI] | "
             "A recon* | A-lr10 − A recon* [95% CI] | grid SE | MLPerf SE |", "|---:" * 9 + "|"]  # fmt: skip
    for a in runs["A"]:
        b = worse.get(a["step"])
        if b is None:
            continue
        ma, mb = (Metric(step=r["step"], **metric_values({k: v for k, v in r.items() if k != "val_flow_grid"}))
                  for r in (a, b))  # fmt: skip
        cells = []
        for metric in ("val_flow_loss", "recon_lpips"):
            d = difference(mb, ma, metric)
            assert d is not None and d.low is not None and d.high is not None
            if first[metric] is None and (d.low > 0 or d.high < 0):
                first[metric] = a["step"]
            cells.append(f"{d.diff:+.4f} [{d.low:+.4f}, {d.high:+.4f}]")
        est = estimators(a["val_flow_grid"])
        flow_a = f"{a['val_flow_loss']:.4f} ± {a['val_flow_loss_se']:.4f}"
        lines.append(f"| {a['step']} | {a['train_loss']:.4f} | {flow_a} | "
                     f"{b['val_flow_loss']:.4f} | {cells[0]} | {a['recon_lpips']:.4f} | {cells[1]} | "
                     f"{est['grid_se']:.4f} | {est['mlperf_se']:.4f} |")  # fmt: skip
    lines += ["", f"first step whose 95% interval excludes zero: val_flow_loss {first['val_flow_loss']}, "
              f"stand-in recon LPIPS {first['recon_lpips']}",
              f"n = {runs['A'][-1]['val_flow_loss_n']} held-out images; {runs['A'][-1]['val_flow_definition']}; "
              f"evaluated on {runs['A'][-1]['eval_weights']} weights"]  # fmt: skip
    text = "\n".join(lines)
    print(text)
    (args.out / "flow_report.md").write_text(text + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arm", choices=list(ARMS))
    p.add_argument("--report", action="store_true")
    p.add_argument("--size", default="small")
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--every", type=int, default=250)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--n", type=int, default=64, help="held-out images (both metrics)")
    p.add_argument("--sampler-steps", type=int, default=10, help="Euler steps of the LPIPS generations")
    p.add_argument("--deadline-s", type=float, default=math.inf)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--work", type=Path, default=Path("/tmp/val-flow"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    report(args) if args.report else train(args)


if __name__ == "__main__":
    main()
