"""Arm I (FP8) against arm G (bf16) at `small` size on one GPU: same seeds, same schedule (issue 27, item 2).

Trains one arm with `worker.train.train_arm` (the trainer's defaults: compile on CUDA, micro-batch auto,
FP8 on every filtered linear for I) and writes its records to OUT/fp8_<arm>.jsonl as they come; every
record carries the per-sample recon and text LPIPS (`recon_lpips_samples`, ...), generated from the same
held-out images and the same seeded noise in both arms, so I - G pairs sample by sample. Run G and I as
two processes at once on the one GPU (the same spec but for the arm), then `--report` pairs them:
I - G at the final checkpoint and at each arm's best, with 95% intervals from
`orchestrator.results.reports.stats.difference`, and both loss curves.

A wall-clock budget (--deadline-s) stops an arm gracefully (final checkpoint, evaluated) if the steps do
not fit; the report then compares at the last step both arms evaluated.

    python bench/fp8_quality.py --arm G --steps 1000 --every 250 --out DIR &   # GPU, one process per arm
    python bench/fp8_quality.py --arm I --steps 1000 --every 250 --out DIR; wait
    python bench/fp8_quality.py --report --out DIR
    python bench/fp8_quality.py --arm G --size tiny --device cpu --steps 4 --every 2 --out DIR  # dry run
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

METRICS = ("recon_lpips", "text_lpips")
STUDY_CLAIM = 0.006  # the seed study: FP8 within 0.006 recon LPIPS of bf16


def spec_for(arm: str, size: str, steps: int, every: int, batch: int):
    from orchestrator.grids.arms import resolve

    return resolve(arm, {
        "model": {"size": size},
        "data": {"dataset": "shapes", "num_images": 4096, "held_out": 25 if size != "tiny" else 8},
        "schedule": {"steps": steps, "batch_size": batch, "warmup_steps": max(1, steps // 10),
                     "checkpoint_every": every, "ema": {"warmup_steps": max(1, steps // 10)}},
        # Offline machine: the labelled stand-ins (recorded on every record).
        "eval": {"lpips_backbone": "random_standin",
                 **({"num_samples": 8, "sampler_steps": 5} if size == "tiny" else {})},
        "repa": {"teacher": "random_standin"},
    })


def train(args: argparse.Namespace) -> None:
    from worker.train import train_arm

    spec = spec_for(args.arm, args.size, args.steps, args.every, args.batch)
    t0 = time.monotonic()
    path = args.out / f"fp8_{args.arm}.jsonl"
    run_dir = (args.work or args.out) / f"run-{args.arm}"
    if not args.resume:  # train_arm would resume it: start fresh
        path.unlink(missing_ok=True)
        shutil.rmtree(run_dir, ignore_errors=True)
    for rec in train_arm(spec, run_dir, device=args.device,
                         should_stop=lambda: time.monotonic() - t0 > args.deadline_s):
        with path.open("a") as f:
            f.write(json.dumps(rec, default=str) + "\n")
        shown = {k: rec.get(k) for k in ("step", "train_loss", "recon_lpips", "text_lpips", "iter_per_sec", "final")}
        print(f"{args.arm} {json.dumps(shown)} [{time.monotonic() - t0:.0f} s]", flush=True)


def _row(rec: dict[str, Any]) -> SimpleNamespace:
    """A record as the metric row `stats.difference` reads (per-sample values under extra)."""
    return SimpleNamespace(**rec, extra={f"{m}_samples": rec.get(f"{m}_samples") for m in METRICS})


def report(out: Path) -> str:
    from orchestrator.results.reports.stats import difference

    recs = {arm: [json.loads(line) for line in (out / f"fp8_{arm}.jsonl").read_text().splitlines()] for arm in "GI"}
    g_by, i_by = ({r["step"]: r for r in recs[a]} for a in "GI")
    common = sorted(s for s in set(g_by) & set(i_by) if g_by[s]["train_loss"] is not None)
    if not common:
        return f"no step both arms trained and evaluated: G {sorted(g_by)}, I {sorted(i_by)}"
    last_i, last_g = recs["I"][-1], recs["G"][-1]
    lines = [
        f"device {last_g.get('device_name')}; LPIPS backbone {last_g.get('lpips_backbone')}; "
        f"G precision {last_g.get('precision')}, I precision {last_i.get('precision')} with "
        f"{len(last_i.get('fp8_linears') or [])} FP8 linears ({last_i.get('fp8_autotune')})",
        f"micro-batch G {last_g.get('micro_batch')} x {last_g.get('grad_accum')}, I {last_i.get('micro_batch')} x "
        f"{last_i.get('grad_accum')}; compiled G {last_g.get('compiled')}, I {last_i.get('compiled')}",
        f"fallbacks G {last_g.get('fallbacks')}; I {last_i.get('fallbacks')}",
        "",
        "| step | G loss | I loss | G recon | I recon | I - G recon [95% CI] | G text | I text | I - G text [95% CI] "
        "| G it/s | I it/s |",
        "|---:|---:|---:|---:|---:|---|---:|---:|---|---:|---:|",
    ]

    def fmt(d) -> str:
        return f"{d.diff:+.4f} [{d.low:+.4f}, {d.high:+.4f}]" if d and d.low is not None else "-"

    for s in common:
        g, i = g_by[s], i_by[s]
        dr, dt = (difference(_row(i), _row(g), m) for m in METRICS)
        lines.append(
            f"| {s} | {g['train_loss']:.4f} | {i['train_loss']:.4f} | {g['recon_lpips']:.4f} | {i['recon_lpips']:.4f} "
            f"| {fmt(dr)} | {g['text_lpips']:.4f} | {i['text_lpips']:.4f} | {fmt(dt)} "
            f"| {g['iter_per_sec'] or 0:.2f} | {i['iter_per_sec'] or 0:.2f} |"
        )
    lines.append("")
    final = common[-1]
    best = {a: min((r for r in recs[a] if r["step"] in common), key=lambda r: r["recon_lpips"]) for a in "GI"}
    for label, i, g in (("final", i_by[final], g_by[final]), ("best", best["I"], best["G"])):
        for m in METRICS:
            d = difference(_row(i), _row(g), m)
            verdict = ""
            if m == "recon_lpips" and d is not None and d.low is not None:
                inside = -STUDY_CLAIM <= d.low and d.high <= STUDY_CLAIM
                verdict = (f"; interval inside +-{STUDY_CLAIM}: {inside}; |diff| <= {STUDY_CLAIM}: "
                           f"{abs(d.diff) <= STUDY_CLAIM}")
            lines.append(f"{label} (I step {i['step']}, G step {g['step']}) {m}: I - G {fmt(d)}, "
                         f"paired n={d.n if d else '-'}{verdict}")
    return "\n".join(lines)


def curves(out: Path, metric: str) -> str:
    """The two arms' metric over steps as an SVG (the grid report's plot: best checkpoints as dots)."""
    from orchestrator.results.reports.render import curves_svg

    arms = []
    for arm in "GI":
        recs = [json.loads(line) for line in (out / f"fp8_{arm}.jsonl").read_text().splitlines()]
        recs = [r for r in recs if r.get(metric) is not None]
        best = min(recs, key=lambda r: r[metric]) if recs else {}
        arms.append(SimpleNamespace(
            arm=arm, series={"step": [r["step"] for r in recs], metric: [r[metric] for r in recs]},
            best_step=best.get("step"), best_value=best.get(metric), detector=SimpleNamespace(stopped=False)))
    return curves_svg(arms, metric)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arm", choices=["G", "I"])
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--size", default="small")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--every", type=int, default=250)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--deadline-s", type=float, default=1e9, help="stop gracefully after this many seconds")
    ap.add_argument("--out", type=Path, required=True, help="records (fp8_ARM.jsonl) and the report")
    ap.add_argument("--work", type=Path, default=None, help="run directories, checkpoints (default: --out)")
    ap.add_argument("--resume", action="store_true",
                    help="continue the run in --work (one stopped by its deadline), appending to its records")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report:
        text = report(args.out)
        print(text)
        (args.out / "fp8_quality.md").write_text(text + "\n")
        for metric in ("train_loss", "recon_lpips"):
            (args.out / f"fp8_{metric}.svg").write_text(curves(args.out, metric))
    elif args.arm:
        train(args)
    else:
        ap.error("--arm G|I or --report")


if __name__ == "__main__":
    main()
