"""Arm I (FP8) vs arm G (bf16 spec; fp32 on CPU) recon LPIPS parity on a tiny CPU run (issue 3).

Trains G and I with `worker.train.train_arm` at tiny size on `shapes` with the same seeds and
settings as `ablate train ARM --size tiny --lpips-standin --repa-standin` (the CLI's TINY_OVERRIDES
plus the random stand-in LPIPS backbone and REPA teacher), then prints one markdown row per
checkpoint: train loss, recon LPIPS ± SE per arm and the paired difference I - G with its SE.

The records carry only mean and SE, so this script captures the per-sample recon LPIPS values by
wrapping the LPIPS callable that `evaluate` receives (bench-only; nothing in the trainer changes).
Both arms evaluate the same held-out images with the same seeded noise, so the per-sample
differences are paired. On CPU torchao float8 quantises to real e4m3 (torch._scaled_mm has a CPU
kernel) and the FP8 autotune is skipped, so I converts exactly the linears its filter selects.

    python bench/fp8_parity.py [--steps 300] [--checkpoint-every 50] [--out DIR]
"""

from __future__ import annotations

import argparse
import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import worker.train as wt
import worker.train_record as wr
from model.evaluate import evaluate as _evaluate
from orchestrator.cli.train import build_spec


class _Recorder:
    """LPIPS callable that keeps every call's per-sample output (evaluate calls recon first)."""

    def __init__(self, metric: Any) -> None:
        self.metric = metric
        self.label = getattr(metric, "label", "unknown")
        self.calls: list[torch.Tensor] = []

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = self.metric(a, b)
        self.calls.append(out.detach().flatten().float().cpu())
        return out


_PER_SAMPLE: list[torch.Tensor] = []  # recon LPIPS per held-out sample, one tensor per evaluation


def _evaluate_recording(*args: Any, **kwargs: Any) -> dict[str, Any]:
    args = list(args)
    rec = _Recorder(args[5])
    args[5] = rec
    out = _evaluate(*args, **kwargs)
    # Per held-out batch evaluate calls LPIPS twice (recon, then text-only): recon is every even call.
    n_batches = math.ceil(args[4].num_samples / kwargs.get("batch_size", 32))
    recon = torch.cat(rec.calls[0 : 2 * n_batches : 2]).double()
    assert abs(recon.mean().item() - out["recon_lpips"]) < 1e-9, "captured values do not match the record"
    _PER_SAMPLE.append(recon)
    return out


def run_arm(arm: str, steps: int, every: int, out: Path) -> list[dict[str, Any]]:
    spec = build_spec(arm, "tiny", steps, every, None, True, True, None)
    shutil.rmtree(out, ignore_errors=True)  # train_arm resumes from out: start fresh
    _PER_SAMPLE.clear()
    t0 = time.perf_counter()
    records = []
    for rec in wt.train_arm(spec, out, "cpu"):
        rec["recon_per_sample"] = _PER_SAMPLE[-1]
        records.append(rec)
        print(f"  {arm} step {rec['step']}: loss {rec['train_loss']:.4f} recon {rec['recon_lpips']:.4f}", flush=True)
    print(f"  {arm}: {time.perf_counter() - t0:.0f} s wall", flush=True)
    return records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--out", type=Path, default=None, help="run dirs go under here (default: a temp dir)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # 2 shared cores: more threads spin-wait (docs/benchmarks.md, trainer)
    wr.evaluate = _evaluate_recording  # bench-only capture of per-sample recon LPIPS (Checkpoints calls it)
    root = args.out or Path(tempfile.mkdtemp(prefix="fp8_parity_"))
    runs = {arm: run_arm(arm, args.steps, args.checkpoint_every, root / arm) for arm in ("G", "I")}
    g_recs, i_recs = runs["G"], runs["I"]

    print()
    print(f"torch {torch.__version__}, device {g_recs[-1].get('device_name')}, LPIPS backbone "
          f"{g_recs[-1]['lpips_backbone']}, precision G={g_recs[-1]['precision']} I={i_recs[-1]['precision']}")
    print(f"G fp8_linears: {len(g_recs[-1]['fp8_linears'])}; I fp8_linears: {len(i_recs[-1]['fp8_linears'])}")
    print(f"I FP8 linears: {', '.join(i_recs[-1]['fp8_linears'])}")
    for arm, recs in runs.items():
        print(f"{arm} fallbacks: {recs[-1]['fallbacks']}")
    print()
    print("| step | G loss | I loss | G recon LPIPS ± SE | I recon LPIPS ± SE | I − G ± paired SE | diff / SE "
          "| G it/s | I it/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for g, i in zip(g_recs, i_recs, strict=True):
        assert g["step"] == i["step"]
        d = i["recon_per_sample"] - g["recon_per_sample"]
        se = (d.std(unbiased=True) / math.sqrt(d.numel())).item()
        z = d.mean().item() / se if se > 0 else float("nan")

        def ips(r: dict[str, Any]) -> str:
            return f"{r['iter_per_sec']:.1f}" if r["iter_per_sec"] else "-"

        print(f"| {g['step']} | {g['train_loss']:.4f} | {i['train_loss']:.4f} "
              f"| {g['recon_lpips']:.4f} ± {g['recon_lpips_se']:.4f} "
              f"| {i['recon_lpips']:.4f} ± {i['recon_lpips_se']:.4f} "
              f"| {d.mean().item():+.1e} ± {se:.1e} | {z:+.2f} | {ips(g)} | {ips(i)} |")
    n = g_recs[-1]["recon_lpips_n"]
    print(f"\nn = {n} held-out samples per evaluation; paired SE from per-sample differences.")


if __name__ == "__main__":
    main()
