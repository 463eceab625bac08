"""Checkpoint size per arm at a model size, from parameter counts, and what uploading it takes.

A checkpoint (worker/train_record.py `_state`) holds the model, its EMA copy (float32), every optimizer's
state and small things (RNG states, the record, the spec, AsymFlow's basis). Counted here on the meta
device (no memory), with the optimizer state by rule: AdamW keeps exp_avg and exp_avg_sq (2 x float32
per parameter), torch.optim.Muon one momentum buffer (1 x float32) for the 2-D block weights it owns.
The REPA projector (arms D-I) is hidden x teacher-dim, bias-free; DINOv2 ViT-B/14 (768) is assumed.
The learned text embedding (vocabulary x hidden: a few hundred caption words) is left out (< 0.2%).

    python bench/checkpoint_size.py --size seed [--gbit 1]

Prints a Markdown table (docs/operations.md carries its output).
"""

from __future__ import annotations

import argparse

import torch

from model.nanodit import NanoDiT
from model.optim import hidden_weight_names
from model.spec import SIZES
from orchestrator.grids.arms import resolve

TEACHER_DIM = 768  # DINOv2 ViT-B/14 patch features
FP32 = 4


def sizes(arm: str, size: str) -> dict[str, float]:
    spec = resolve(arm, {"model": {"size": size}})
    hidden = spec.model.dims().hidden
    with torch.device("meta"):
        model = NanoDiT(spec, text_dim=hidden)  # the learned text encoder's width is the model's hidden size
    params = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    total = sum(params.values())
    projector = hidden * TEACHER_DIM if spec.repa.enabled else 0
    muon = sum(params[n] for n in hidden_weight_names(model)) if spec.optimizer.name == "muon" else 0
    adamw = total + projector - muon
    ema = total if spec.schedule.ema.enabled else 0
    return {
        "params": total,
        "model": (total + projector) * FP32,
        "ema": ema * FP32,
        "optimizer": (2 * adamw + muon) * FP32,
        "muon_params": muon,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=list(SIZES), default="seed")
    parser.add_argument("--gbit", type=float, default=1.0, help="link speed for the upload time, Gbit/s")
    parser.add_argument("--arms", default="ABCDEFGHI")
    args = parser.parse_args()
    rate = args.gbit * 1e9 / 8  # bytes/s, payload at line rate (protocol overhead not counted)
    print(
        "| arm | params (M) | model (GB) | EMA (GB) | optimizer state (GB) | checkpoint (GB) "
        f"| upload at {args.gbit:g} Gbit/s (s) |"
    )
    print("|---|---|---|---|---|---|---|")
    for arm in args.arms:
        s = sizes(arm, args.size)
        total = s["model"] + s["ema"] + s["optimizer"]
        opt = f"{s['optimizer'] / 1e9:.2f}" + (f" (Muon on {s['muon_params'] / 1e6:.1f}M)" if s["muon_params"] else "")
        print(
            f"| {arm} | {s['params'] / 1e6:.1f} | {s['model'] / 1e9:.2f} | {s['ema'] / 1e9:.2f} | {opt} "
            f"| {total / 1e9:.2f} | {total / rate:.0f} |"
        )


if __name__ == "__main__":
    main()
