"""A researcher's own trainer, runnable as an ablate command arm: copy it and put your model in.

It imports nothing from ablate. The contract is four environment variables (docs/your-trainer.md):
ABLATE_RUN_DIR (checkpoints/ under it is stored and restored), ABLATE_METRICS_FILE (append JSON lines),
ABLATE_STOP_FILE (exists: save and exit 0), ABLATE_RESUMED ("1": continue from checkpoints/). Run by hand
it writes under ./ablate-run.

It fits a small MLP to a fixed random function of 16 inputs (data generated from a seed, so a resumed run
sees the same batches) and reports the held-out loss every --every steps, with `val_loss_samples`, the loss
of each of the 512 held-out items (the same items for every arm and seed): with it ablate's report gives
this arm's comparisons the same paired and seeds x items intervals as its own arms. A grid's `seeds: N`
sets ABLATE_SEED (0 .. N-1): the model's initialisation and the batches' order follow it, the held-out
items and the target function do not. --diverge-at N raises the
learning rate 2x every 10 steps from step N on: the held-out loss rises and ablate's detector stops the arm.

    python train.py --lr 3e-4 --steps 2000 --every 50
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import torch
from torch import nn

RUN_DIR = Path(os.environ.get("ABLATE_RUN_DIR", "ablate-run"))
CKPTS = RUN_DIR / "checkpoints"
METRICS = Path(os.environ.get("ABLATE_METRICS_FILE", RUN_DIR / "metrics.jsonl"))
STOP = Path(os.environ.get("ABLATE_STOP_FILE", RUN_DIR / "STOP"))


SEED = int(os.environ.get("ABLATE_SEED", "0"))  # the replicate: training noise only


def batch(step: int, size: int, teacher: nn.Module, seed: int = SEED) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of `step` is a function of the step and the seed alone: a resume trains on the same data."""
    g = torch.Generator().manual_seed(1000 + step + 1_000_003 * seed)
    x = torch.randn(size, 16, generator=g)
    with torch.no_grad():
        return x, teacher(x)


def _number(v: float) -> float | str:
    return v if math.isfinite(v) else str(v)


def report(step: int, checkpoint: str | None = None, **metrics: float | list[float]) -> None:
    line = {"step": step, **{k: [_number(x) for x in v] if isinstance(v, list) else _number(v)
                             for k, v in metrics.items()}}  # fmt: skip
    if checkpoint is not None:
        line["checkpoint"] = checkpoint  # relative to ABLATE_RUN_DIR, written before this line
    with METRICS.open("a") as fh:  # appended and synced per line: a crash loses no reported metric
        fh.write(json.dumps(line) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def save(step: int, model: nn.Module, opt: torch.optim.Optimizer) -> str:
    name = f"checkpoints/step_{step:06d}.pt"
    tmp = RUN_DIR / (name + ".tmp")
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
    os.replace(tmp, RUN_DIR / name)  # never half a file under the name the metrics line gives
    return name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=50, help="evaluate and checkpoint every N steps")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--diverge-at", type=int, default=None, help="from this step on, the lr doubles every 10 steps")
    args = parser.parse_args()
    CKPTS.mkdir(parents=True, exist_ok=True)
    METRICS.parent.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)  # the task (the teacher) is the same for every arm and seed
    teacher = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    torch.manual_seed(1 + SEED)
    model = nn.Sequential(nn.Linear(16, args.hidden), nn.GELU(), nn.Linear(args.hidden, 1))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start = 0
    found = sorted(CKPTS.glob("step_*.pt"))
    if os.environ.get("ABLATE_RESUMED") == "1" and found:
        state = torch.load(found[-1], weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        print(f"resumed from {found[-1].name} at step {start}", flush=True)
    val_x, val_y = batch(-1, 512, teacher, seed=0)  # held-out items: the same for every seed

    for step in range(start + 1, args.steps + 1):
        # diverging: the rate doubles every 10 steps from --diverge-at on, so the held-out loss climbs
        diverging = args.diverge_at is not None and step >= args.diverge_at
        lr = args.lr * (2 ** ((step - args.diverge_at) / 10 + 1) if diverging else 1)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = batch(step, args.batch, teacher)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        stopping = STOP.exists()
        if step % args.every == 0 or step == args.steps or stopping:
            with torch.no_grad():
                per_item = ((model(val_x) - val_y) ** 2).mean(dim=1)
            report(step, save(step, model, opt), train_loss=loss.item(), val_loss=per_item.mean().item(),
                   val_loss_samples=per_item.tolist(), lr=lr)
        if stopping:  # ablate asked: the checkpoint above is the last, exit 0 within the grace period
            print(f"stop file seen at step {step}; exiting", flush=True)
            return


if __name__ == "__main__":
    main()
