"""The checkpoint record: what the loop measures between checkpoints (`Window`), and `Checkpoints`, which
evaluates, writes the samples, appends the record to metrics.jsonl and saves the checkpoint (and best.pt).

A record carries the metrics, the throughput and memory, the data fetch and wait, the fallbacks and the
provenance of the run; a checkpoint file holds everything a bit-identical resume needs (`_state`,
`restore_parts`). Imports model/ and worker/ only.
"""

from __future__ import annotations

import math
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from model.data.unreadable import LISTED_NAME, Unreadable, fallback_note
from model.evaluate import evaluate
from model.optim import lr_at
from model.spec import STANDIN
from worker import checkpoint as ckpt
from worker.distribution import DistributionPass
from worker.samples import write_samples
from worker.train_parts import Parts, has_trainable

EVAL_BATCH = 32



# --- checkpoints -----------------------------------------------------------------------------------


def _state(parts: Parts, step: int, gens: dict[str, torch.Generator], extra: dict[str, Any]) -> dict[str, Any]:
    rng: dict[str, Any] = {"torch": torch.get_rng_state(), **{k: g.get_state() for k, g in gens.items()}}
    if parts.device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(parts.device)
    return {
        "step": step,
        "model": parts.model.state_dict(),
        "ema": {k: e.state_dict() for k, e in parts.emas.items()},
        "optimizers": [o.state_dict() for o in parts.optimizers],
        "text_encoder": parts.text_encoder.state_dict() if has_trainable(parts.text_encoder) else None,
        "projector": parts.projector.state_dict() if parts.projector is not None else None,
        "basis": parts.flow.basis,
        "rng": rng,
        "spec": parts.spec.model_dump(mode="json"),
        "fp8_linears": list(parts.fp8_linears),  # reused on resume (see build)
        "micro_batch": parts.micro_batch,  # likewise
        **extra,
    }


def restore_parts(parts: Parts, state: dict[str, Any], gens: dict[str, torch.Generator]) -> None:
    parts.model.load_state_dict(state["model"])
    for k, e in parts.emas.items():
        e.load_state_dict(state["ema"][k])
    for o, s in zip(parts.optimizers, state["optimizers"], strict=True):
        o.load_state_dict(s)
    if state["text_encoder"] is not None:
        parts.text_encoder.load_state_dict(state["text_encoder"])
    if parts.projector is not None:
        parts.projector.load_state_dict(state["projector"])
    if state["basis"] is not None:
        parts.flow.basis = state["basis"].to(parts.device)
    rng = state["rng"]
    torch.set_rng_state(rng["torch"])
    for k, g in gens.items():
        g.set_state(rng[k])
    if "cuda" in rng and parts.device.type == "cuda":
        torch.cuda.set_rng_state(rng["cuda"], parts.device)


# --- measurements ----------------------------------------------------------------------------------


def peak_memory_gb(device: torch.device) -> float:
    """CUDA: max allocated by torch on the device; CPU: the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # ru_maxrss is KiB on Linux


def device_info(device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        uuid = getattr(props, "uuid", None)
        return {"device_name": props.name, "gpu_uuid": f"GPU-{uuid}" if uuid is not None else None}
    import platform

    return {
        "device_name": f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)",
        "gpu_uuid": None,
    }


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --- checkpoint bookkeeping ------------------------------------------------------------------------


@dataclass
class Window:
    """What the loop measures between two checkpoints: loss and grad norm summed on the device (no
    per-step sync), and the steady-state time of the steps after worker/train.py's WARMUP_STEPS."""

    device: torch.device
    loss_sum: Tensor
    gnorm_sum: Tensor
    steps: int = 0
    timed_steps: int = 0
    timed_s: float = 0.0
    t_timing: float | None = None  # perf_counter() when timing (re)started; None before warm-up ends
    wait_s: float = 0.0  # of timed_s: the loop blocked on the loader for its next micro-batch

    @classmethod
    def empty(cls, device: torch.device, timing: bool = False) -> Window:
        zero = torch.zeros((), device=device)
        return cls(device, zero, zero.clone(), t_timing=time.perf_counter() if timing else None)

    def start_timing(self) -> None:
        sync_device(self.device)
        self.t_timing = time.perf_counter()

    def add(self, loss: Tensor, gnorm: Tensor, wait_s: float) -> None:
        self.loss_sum += loss
        self.gnorm_sum += gnorm
        self.steps += 1
        if self.t_timing is not None:
            self.timed_steps += 1
            self.wait_s += wait_s

    def data_wait_fraction(self) -> float | None:
        """Share of the steady-state wall time the loop waited for data (after close())."""
        return min(1.0, self.wait_s / self.timed_s) if self.timed_steps and self.timed_s > 0 else None

    def close(self) -> tuple[float | None, float | None, float | None]:
        """(mean train loss, mean grad norm, steady-state iter/s); syncs the device once."""
        sync_device(self.device)
        if self.t_timing is not None:
            self.timed_s += time.perf_counter() - self.t_timing
        ips = self.timed_steps / self.timed_s if self.timed_steps and self.timed_s > 0 else None
        if not self.steps:
            return None, None, ips
        return (self.loss_sum / self.steps).item(), (self.gnorm_sum / self.steps).item(), ips


@dataclass
class Checkpoints:
    """Evaluates, records and saves a checkpoint; keeps what a resume needs (wall time so far, the last
    record, the best value of the judged metric and its step)."""

    parts: Parts
    out_dir: Path
    gens: dict[str, torch.Generator]
    resumed_from: int = 0
    wall_before: float = 0.0  # seconds trained by earlier processes of this run
    gpu_hours_before: float = 0.0  # their GPU-hours, each at its own world size (an arm may have grown since)
    last_record: dict[str, Any] | None = None
    best: dict[str, Any] = field(default_factory=lambda: {"step": None})  # and the judged metric's value
    t_start: float = field(default_factory=time.perf_counter)
    info: dict[str, Any] = field(default_factory=dict)  # device name and UUID, loader workers: on every record
    skips: Unreadable | None = None  # images left out as unreadable, at start and mid-run, over every segment
    compile_s: float | None = None  # this process's first step, compile included (compiled runs only)
    provenance: dict[str, Any] = field(default_factory=ckpt.provenance)  # code and library versions, in every file
    distribution: DistributionPass | None = None  # eval.distribution's pass, at its cadence (worker/distribution.py)

    def restore(self, state: dict[str, Any], write: bool = True) -> int:
        """Load a checkpoint into the parts and this bookkeeping; returns its step. write=False (a rank
        other than 0 of a data-parallel arm): metrics.jsonl is rank 0's to cut back."""
        restore_parts(self.parts, state, self.gens)
        self.resumed_from, self.wall_before = state["step"], state["wall_time_s"]
        self.last_record, self.best = state["record"], state["best"]
        before = (self.last_record or {}).get("gpu_hours")
        self.gpu_hours_before = before if isinstance(before, int | float) else 0.0
        if self.skips is not None:  # the count goes on from where the run left it, not from 0
            self.skips.add(state.get("unreadable") or [])
        if write:
            ckpt.truncate_metrics(self.out_dir, self.resumed_from)
        return self.resumed_from

    def wall(self) -> float:
        return self.wall_before + time.perf_counter() - self.t_start

    def save(self, step: int, window: Window, final: bool) -> dict[str, Any]:
        """Evaluate at `step`, append the record to metrics.jsonl, write the checkpoint (and best.pt)."""
        parts, spec, sched = self.parts, self.parts.spec, self.parts.spec.schedule
        train_loss, grad_norm, ips = window.close()
        t_eval = time.perf_counter()
        use_ema = spec.eval.use_ema and "model" in parts.emas
        metrics = evaluate(
            parts.emas["model"].module if use_ema else parts.model,
            parts.emas["text_encoder"].module if use_ema and "text_encoder" in parts.emas else parts.text_encoder,
            parts.flow,
            parts.dataset,
            spec.eval,
            parts.lpips,
            parts.device,
            batch_size=EVAL_BATCH,
            autocast=parts.autocast,
            keep_images=True,
        )
        # The PNGs before the record that names them (metrics.jsonl is what a resume trusts).
        samples = write_samples(self.out_dir, step, metrics.pop("images"))
        eval_s = time.perf_counter() - t_eval
        note = metrics.get("text_manip_note")
        if note is not None and note not in parts.fallbacks:
            parts.fallbacks.append(note)  # build checks too; this keeps any skipped metric on the record
        if self.distribution is not None and self.distribution.due(step, final):
            metrics |= self.distribution.measure(
                parts.emas["model"].module if use_ema else parts.model,
                parts.emas["text_encoder"].module if use_ema and "text_encoder" in parts.emas else parts.text_encoder,
                parts.flow, parts.dataset, parts.autocast,
            )  # fmt: skip
            for line in self.distribution.fallbacks():  # a stand-in extractor, said where the run's fallbacks are
                if line not in parts.fallbacks:
                    parts.fallbacks.append(line)
        self.list_unreadable()
        path = ckpt.checkpoint_path(self.out_dir, step)
        # best.pt follows the metric the detector judges, so the checkpoint it keeps is the one it names.
        judged = spec.detector.judged_metric(metrics.get("lpips_backbone") == STANDIN)
        value, held = metrics.get(judged), self.best.get(judged)
        lower = spec.detector.metric_mode == "min"
        is_best = (
            isinstance(value, int | float)
            and math.isfinite(value)
            and (held is None or (value < held if lower else value > held))
        )
        if is_best:
            self.best = {"step": step, judged: value}
        elapsed = self.wall()
        tokens_per_image = (spec.resolution() // parts.flow.patch) ** 2
        record: dict[str, Any] = {
            "step": step,
            "train_loss": train_loss,
            "grad_norm": grad_norm,
            "lr": lr_at(max(step - 1, 0), sched),
            **metrics,
            # which weights every metric above (val_flow_loss included) was measured on
            "eval_weights": "ema" if use_ema else "live",
            "iter_per_sec": ips,
            "data_wait_fraction": window.data_wait_fraction(),
            "samples_per_sec": ips * sched.batch_size if ips else None,
            "tokens_per_sec": ips * sched.batch_size * tokens_per_image if ips else None,
            "peak_memory_gb": peak_memory_gb(parts.device),
            "wall_time_s": elapsed,
            # earlier processes' GPU-hours, and this one's wall time on this many GPUs
            "gpu_hours": self.gpu_hours_before + (elapsed - self.wall_before) / 3600 * parts.world.size
            if parts.device.type == "cuda" else 0.0,
            "eval_time_s": eval_s,
            "samples": samples,
            "checkpoint": str(path),
            "best_checkpoint": str(self.out_dir / ckpt.BEST_NAME) if self.best["step"] is not None else None,
            "best_step": self.best["step"],
            "is_best": is_best,
            **self.info,
            "precision": parts.precision_mode,
            "fallbacks": list(parts.fallbacks),
            "fp8_linears": parts.fp8_linears,
            "fp8_autotune": parts.fp8_autotune,
            "repa_teacher": parts.teacher.label if parts.teacher is not None else None,
            "resumed_from_step": self.resumed_from or None,
            "micro_batch": parts.micro_batch,
            "grad_accum": parts.grad_accum,
            "micro_batch_how": parts.micro.how if parts.micro is not None else None,
            "compiled": parts.compiled,
            "compile_s": self.compile_s,
            "skipped_images": self.skips.count if self.skips is not None else 0,
            "skipped_files": self.skips.first() if self.skips is not None else [],
            "final": final,
        }
        # metrics.jsonl before the checkpoint: a kill in between re-does this step on resume
        # (truncate_metrics drops the line), never leaves a checkpoint without its record.
        ckpt.append_metrics(self.out_dir, record)
        extra = {"wall_time_s": elapsed, "record": record, "best": self.best, **self.provenance}
        if self.skips is not None and self.skips.count:
            extra["unreadable"] = list(self.skips.names)  # every one, so the count survives a resume
        ckpt.save_atomic(_state(parts, step, self.gens, extra), path)
        if is_best:
            ckpt.mark_best(path, self.out_dir)
        ckpt.prune(self.out_dir)
        self.last_record = record
        return record

    def list_unreadable(self) -> None:
        """The first unreadable images as fallbacks (one stable line each) and all of them in
        unreadable.txt beside metrics.jsonl."""
        if self.skips is None or not self.skips.count:
            return
        for name in self.skips.first():
            if (note := fallback_note(name)) not in self.parts.fallbacks:
                self.parts.fallbacks.append(note)
        tmp = self.out_dir / f"{LISTED_NAME}.part"
        tmp.write_text("".join(f"{name}\n" for name in self.skips.names))
        tmp.replace(self.out_dir / LISTED_NAME)

    def final(self, step: int, window: Window) -> dict[str, Any]:
        """The record to end on when asked to stop at `step`: the checkpoint just written, else a new one."""
        if self.last_record is not None and self.last_record["step"] == step:
            return {**self.last_record, "final": True}
        return self.save(step, window, final=True)
