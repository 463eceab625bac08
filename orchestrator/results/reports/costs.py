"""What a run cost, read from its own records: the price of the noise budget's options (effects.py), one
more training run of an arm or one more evaluation pass over its images."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.db.models import Metric, Run
from orchestrator.numbers import is_finite


@dataclass(frozen=True)
class RunCost:
    """What one run cost, from its own records: the training (hours on its GPUs, or on the CPU where it
    ran there) and one evaluation pass of its n images (minutes)."""

    hours: float | None
    eval_minutes: float | None
    n: int | None  # the images that evaluation pass measured
    on_gpu: bool


def run_cost(run: Run, ms: list[Metric]) -> RunCost:
    """What `run` cost by its own records: its training hours (GPU-hours; wall hours where it ran on the
    CPU, whose records say 0 GPU-hours) and its last evaluation pass in minutes on all its GPUs."""
    last = ms[-1] if ms else None
    gpu_hours = max((m.gpu_hours for m in ms if is_finite(m.gpu_hours)), default=None)
    on_gpu = bool(gpu_hours) or bool(run.gpu_name)
    hours = gpu_hours if on_gpu else max((m.wall_time_s for m in ms if is_finite(m.wall_time_s)), default=None)
    if hours is not None and not on_gpu:
        hours /= 3600
    eval_s = (last.extra or {}).get("eval_time_s") if last is not None else None
    gpus = (run.spec or {}).get("gpus") if on_gpu else 1
    gpus = gpus if isinstance(gpus, int) and gpus > 0 else 1
    timed = isinstance(eval_s, int | float) and not isinstance(eval_s, bool) and is_finite(eval_s)
    minutes = eval_s * gpus / 60 if timed else None
    n = last.val_flow_loss_n if last is not None else None
    return RunCost(hours=hours, eval_minutes=minutes, n=n, on_gpu=on_gpu)
