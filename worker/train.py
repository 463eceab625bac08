"""The training loop: one arm on one device, one metric record per checkpoint.

`train_arm` builds the arm's dataset, text encoder, NanoDiT (+ precision, REPA, AsymFlow basis),
optimizers and EMA, resumes from the latest checkpoint in out_dir if there is one, and trains,
yielding a record at every checkpoint. A resumed run continues exactly (bit-identical on CPU): the
checkpoint holds the model, EMA, optimizers, the global torch RNG (TREAD's permutations), the flow-noise
generator and the micro-batch; the data stream is a pure function of (data seed, step), served by loader
worker processes (model/data/loader.py). Imports model/ only.
"""

from __future__ import annotations

import contextlib
import math
import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from model.data import ImageCaptionDataset, as_unit_float, build_dataset
from model.data.captioned import CaptionedDataset
from model.data.loader import MicroBatch, StepBatches, auto_workers, make_loader
from model.data.unreadable import LISTED_NAME, Unreadable, fallback_note
from model.evaluate import NO_EDITS_NOTE, evaluate
from model.flow import FlowMatching, estimate_pca_basis, interpolate, sample_t
from model.nanodit import NanoDiT
from model.optim import EMA, OptimizerStep, build_optimizers, lr_at, set_lr
from model.perceptual import LPIPSMetric, load_lpips
from model.precision import apply_precision, autocast_ctx, deterministic_algorithms
from model.repa import RepaProjector, Teacher, build_teacher, repa_loss, repa_weight
from model.spec import ArmSpec
from model.text import TextEncoder, build_text_encoder
from worker import checkpoint as ckpt
from worker.data_fetch import DataStore, fetch_prepared
from worker.micro_batch import MicroBatchChoice, choose_micro_batch, oom_message
from worker.samples import write_samples

# Steps after each (re)start excluded from iter/s: compile, cudnn autotune, allocator warm-up.
WARMUP_STEPS = 3
# Probability that a training step conditions on the target's identity tokens. The metrics need both
# modes: recon LPIPS generates with identity tokens, text-only LPIPS without them.
IDENTITY_PROB = 0.5
# Images used once to estimate AsymFlow's patch PCA basis (fixed seed: the basis is a function of the data).
PCA_IMAGES = 256
PCA_SEED = 0
EVAL_BATCH = 32
CPU_BF16_FALLBACK = "bf16 autocast not used on CPU (about 2x slower than fp32 there): fp32"
REPA_STANDIN_FALLBACK = "repa teacher: random_standin (no pretrained teacher; REPA aligns to a frozen random network)"
LPIPS_STANDIN_FALLBACK = "lpips backbone: random_standin (metrics are not comparable with real LPIPS)"
# Spec sections that may change between a checkpoint and its resume (they do not touch training).
RESUMABLE_CHANGES = {"name", "description", "detector"}


class TrainError(ValueError):
    """A run that cannot start or resume as asked (one clear line)."""


def check_resumable(saved: dict[str, Any], spec: ArmSpec, path: Path) -> None:
    """Refuse to resume a checkpoint written by a different spec: the run would silently mix two arms.

    The saved spec is read with today's defaults first: a field added since (data.max_unreadable, say)
    is not a difference, so an arm running across an upgrade resumes."""
    try:
        saved = ArmSpec.model_validate(saved).model_dump(mode="json")
    except ValueError:  # a spec today's model refuses: compared as written, and the sections named
        pass
    now = spec.model_dump(mode="json")
    diff = sorted(k for k in set(saved) | set(now) if k not in RESUMABLE_CHANGES and saved.get(k) != now.get(k))
    if diff:
        raise TrainError(
            f"{path} was written by a different spec (sections differ: {', '.join(diff)}); "
            "use a new output directory or the original spec"
        )


@dataclass
class Parts:
    """Everything a run builds before its first step."""

    spec: ArmSpec
    device: torch.device
    dataset: ImageCaptionDataset
    text_encoder: TextEncoder
    model: nn.Module  # NanoDiT, possibly FP8-converted and compiled
    flow: FlowMatching
    optimizers: list[torch.optim.Optimizer]
    opt_step: OptimizerStep  # every optimizer's step(), compiled where it can be
    trainable: list[nn.Parameter]  # what gradient clipping sees
    emas: dict[str, EMA]  # "model", and "text_encoder" when it trains
    lpips: LPIPSMetric
    teacher: Teacher | None  # REPA only
    projector: RepaProjector | None
    repa_block: int | None
    autocast: Callable[[], contextlib.AbstractContextManager]
    fallbacks: list[str] = field(default_factory=list)
    fp8_linears: list[str] = field(default_factory=list)
    fp8_autotune: str | None = None  # what chose the FP8 set ("skipped: not CUDA", "reused from checkpoint: ...")
    precision_mode: str = "bf16"  # what actually ran (fp32 where CPU_BF16_FALLBACK applied)
    micro: MicroBatchChoice | None = None  # images per forward/backward and how they were chosen
    compiled: bool = False  # precision.compile as resolved for the device

    @property
    def micro_batch(self) -> int:
        assert self.micro is not None
        return self.micro.size

    @property
    def grad_accum(self) -> int:
        return self.spec.schedule.batch_size // self.micro_batch


def _has_trainable(module: nn.Module) -> bool:
    return any(p.requires_grad for p in module.parameters())


def build(
    spec: ArmSpec,
    device: torch.device,
    lpips_weights: Path | None,
    fp8_linears: list[str] | None = None,
    micro_batch: int | None = None,
    data_root: Path | None = None,
    data_pin: str | None = None,
) -> Parts:
    """Construct a run's parts; model init uses the global RNG seeded from data.seed.

    fp8_linears: the FP8 set saved in the checkpoint being resumed (None on a fresh start): converted as
    is, without re-timing, so the resumed run keeps the numerics it started with. micro_batch: likewise
    the micro-batch the resumed run trained with (not searched again). data_root: the local copy of
    data.url (fetched by train_arm), else None. data_pin: the sha256 of the prepared manifest the resumed
    run started on (its checkpoint record's data_manifest_sha256): a different one is refused.
    """
    torch.manual_seed(spec.data.seed)
    fallbacks: list[str] = []
    dataset = build_dataset(spec, data_root, data_pin)
    if not dataset.supports_edits:  # known now, so the first record already says so
        fallbacks.append(NO_EDITS_NOTE)
    # LPIPS and the teacher first: a missing weights file should fail before any work is done.
    lpips = load_lpips(spec.eval, weights=lpips_weights, device=str(device))
    if lpips.label == "random_standin":
        fallbacks.append(LPIPS_STANDIN_FALLBACK)
    text_encoder = build_text_encoder(spec, dataset).to(device)
    dims = spec.model.dims()
    model = NanoDiT(spec, text_dim=text_encoder.dim).to(device)

    teacher = projector = None
    repa_block = None
    if spec.repa.enabled:
        teacher = build_teacher(spec.repa, device)
        if teacher.label == "random_standin":
            fallbacks.append(REPA_STANDIN_FALLBACK)
        projector = RepaProjector(dims.hidden, teacher.dim).to(device)
        repa_block = spec.repa.block if spec.repa.block is not None else dims.depth // 2

    basis = None
    if spec.flow.kind == "asymflow":
        basis = estimate_pca_basis(dataset.sample_images(PCA_IMAGES, PCA_SEED), dims.patch, spec.flow.rank).to(device)
    flow = FlowMatching(spec.flow, dims.patch, basis)

    # The EMA copies are taken before FP8 conversion and compile: plain modules with the same parameter
    # names, evaluated under bf16 autocast (the study's weights stay high precision either way).
    emas: dict[str, EMA] = {}
    if spec.schedule.ema.enabled:
        emas["model"] = EMA(model, spec.schedule.ema)
        if _has_trainable(text_encoder):
            emas["text_encoder"] = EMA(text_encoder, spec.schedule.ema)

    precision = spec.precision
    if precision.compile is None:  # the default: compiled where the device is CUDA
        precision = precision.model_copy(update={"compile": device.type == "cuda"})
    if device.type == "cpu" and precision.mode == "bf16":
        fallbacks.append(CPU_BF16_FALLBACK)
        precision = precision.model_copy(update={"mode": "fp32"})
    autocast = partial(autocast_ctx, precision, device)
    # The micro-batch is found eager, before FP8 conversion and compile: both use less memory than eager
    # bf16, so what fits here fits there (the margin covers compile's own buffers).
    micro = choose_micro_batch(
        spec, device, model, text_encoder, dataset, autocast, teacher, repa_block, fixed=micro_batch
    )
    if micro.note:
        fallbacks.append(micro.note)
    if precision.compile_mode == "reduce-overhead" and micro.size != spec.schedule.batch_size:
        fallbacks.append(
            f"compile_mode reduce-overhead needs one micro-batch per step; micro-batch {micro.size} of "
            f"{spec.schedule.batch_size}: compile_mode default"
        )
        precision = precision.model_copy(update={"compile_mode": "default"})
    micro_tokens = micro.size * (spec.resolution() // dims.patch) ** 2
    # FP8 autotune times at this size (unless the set comes from the checkpoint)
    report = apply_precision(model, precision, device, tokens=micro_tokens, fp8_linears=fp8_linears)
    fallbacks.extend(report.fallbacks)

    extra: list[tuple[str, nn.Parameter]] = []
    if _has_trainable(text_encoder):
        extra += [(f"text_encoder.{n}", p) for n, p in text_encoder.named_parameters() if p.requires_grad]
    if projector is not None:
        extra += [(f"repa_projector.{n}", p) for n, p in projector.named_parameters()]
    optimizers = build_optimizers(model, spec, extra=extra)
    # Compiled on CUDA with precision.compile; a compile failure lands in fallbacks at the 2nd step.
    opt_step = OptimizerStep(optimizers, precision.compile, device, on_fallback=fallbacks.append)
    trainable = [p for p in model.parameters() if p.requires_grad] + [p for _, p in extra]
    return Parts(
        spec=spec,
        device=device,
        dataset=dataset,
        text_encoder=text_encoder,
        model=model,
        flow=flow,
        optimizers=optimizers,
        opt_step=opt_step,
        trainable=trainable,
        emas=emas,
        lpips=lpips,
        teacher=teacher,
        projector=projector,
        repa_block=repa_block,
        autocast=autocast,
        fallbacks=fallbacks,
        fp8_linears=list(report.fp8_linears),
        fp8_autotune=report.autotune,
        precision_mode=precision.mode,
        micro=micro,
        compiled=bool(precision.compile),
    )


# --- one optimizer step ----------------------------------------------------------------------------


def train_step(parts: Parts, step: int, batches: list[MicroBatch], noise_gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """One optimizer step over its micro-batches (grad accumulation); returns (loss, grad_norm) as 0-d
    tensors (no sync)."""
    spec, dev = parts.spec, parts.device
    sched = spec.schedule
    accum = len(batches)
    w_repa = repa_weight(spec.repa, step, sched.steps) if parts.teacher is not None else 0.0
    total = torch.zeros((), device=dev)
    for mb in batches:
        if spec.precision.compile_mode == "reduce-overhead":  # CUDA graphs: a new iteration (one micro-batch)
            torch.compiler.cudagraph_mark_step_begin()
        # pinned by the loader: the copy is asynchronous; uint8 becomes float on the device
        x0 = parts.dataset.from_unit(as_unit_float(mb.images.to(dev, non_blocking=True)))
        captions, with_identity = mb.captions, mb.identity
        t = sample_t(len(captions), spec.flow, noise_gen, dev)
        eps = torch.randn(x0.shape, generator=noise_gen, device=dev)
        x_t = interpolate(x0, eps, t)
        with parts.autocast():
            text, mask = parts.text_encoder(captions)
            text, mask = text.to(dev), mask.to(dev)
            out = parts.model(
                x_t, t, text, text_mask=mask, identity=x0 if with_identity else None, repa_block=parts.repa_block
            )
            loss = parts.flow.loss(out.out, x0, eps)
            if parts.teacher is not None and w_repa > 0:
                assert out.hidden is not None and parts.projector is not None
                h, w = x0.shape[-2] // parts.flow.patch, x0.shape[-1] // parts.flow.patch
                feats = parts.teacher.features(parts.dataset.to_lpips(x0), (h, w))
                loss = loss + w_repa * repa_loss(out.hidden, out.kept, feats, parts.projector)
        (loss / accum).backward()
        total += loss.detach() / accum
    clip = spec.optimizer.grad_clip if spec.optimizer.grad_clip > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(parts.trainable, clip)
    set_lr(parts.optimizers, lr_at(step, sched))
    parts.opt_step()
    for opt in parts.optimizers:
        opt.zero_grad(set_to_none=True)
    if "model" in parts.emas:
        parts.emas["model"].update(parts.model, step)
    if "text_encoder" in parts.emas:
        parts.emas["text_encoder"].update(parts.text_encoder, step)
    return total, grad_norm.detach()


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
        "text_encoder": parts.text_encoder.state_dict() if _has_trainable(parts.text_encoder) else None,
        "projector": parts.projector.state_dict() if parts.projector is not None else None,
        "basis": parts.flow.basis,
        "rng": rng,
        "spec": parts.spec.model_dump(mode="json"),
        "fp8_linears": list(parts.fp8_linears),  # reused on resume (see build)
        "micro_batch": parts.micro_batch,  # likewise
        **extra,
    }


def _restore(parts: Parts, state: dict[str, Any], gens: dict[str, torch.Generator]) -> None:
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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --- checkpoint bookkeeping ------------------------------------------------------------------------


@dataclass
class Window:
    """What the loop measures between two checkpoints: loss and grad norm summed on the device (no
    per-step sync), and the steady-state time of the steps after WARMUP_STEPS."""

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
        _sync(self.device)
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
        _sync(self.device)
        if self.t_timing is not None:
            self.timed_s += time.perf_counter() - self.t_timing
        ips = self.timed_steps / self.timed_s if self.timed_steps and self.timed_s > 0 else None
        if not self.steps:
            return None, None, ips
        return (self.loss_sum / self.steps).item(), (self.gnorm_sum / self.steps).item(), ips


@dataclass
class Checkpoints:
    """Evaluates, records and saves a checkpoint; keeps what a resume needs (wall time so far, the last
    record, the best recon LPIPS and its step)."""

    parts: Parts
    out_dir: Path
    gens: dict[str, torch.Generator]
    resumed_from: int = 0
    wall_before: float = 0.0  # seconds trained by earlier processes of this run
    last_record: dict[str, Any] | None = None
    best: dict[str, Any] = field(default_factory=lambda: {"step": None, "recon_lpips": None})
    t_start: float = field(default_factory=time.perf_counter)
    info: dict[str, Any] = field(default_factory=dict)  # device name and UUID, loader workers: on every record
    skips: Unreadable | None = None  # images left out as unreadable, at start and mid-run, over every segment
    compile_s: float | None = None  # this process's first step, compile included (compiled runs only)
    provenance: dict[str, Any] = field(default_factory=ckpt.provenance)  # code and library versions, in every file

    def restore(self, state: dict[str, Any]) -> int:
        """Load a checkpoint into the parts and this bookkeeping; returns its step."""
        _restore(self.parts, state, self.gens)
        self.resumed_from, self.wall_before = state["step"], state["wall_time_s"]
        self.last_record, self.best = state["record"], state["best"]
        if self.skips is not None:  # the count goes on from where the run left it, not from 0
            self.skips.add(state.get("unreadable") or [])
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
        self.list_unreadable()
        path = ckpt.checkpoint_path(self.out_dir, step)
        recon = metrics["recon_lpips"]
        is_best = (
            recon is not None
            and math.isfinite(recon)
            and (self.best["recon_lpips"] is None or recon < self.best["recon_lpips"])
        )
        if is_best:
            self.best = {"step": step, "recon_lpips": recon}
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
            "gpu_hours": elapsed / 3600 if parts.device.type == "cuda" else 0.0,
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


# --- the loop --------------------------------------------------------------------------------------


def train_arm(
    spec: ArmSpec,
    out_dir: Path,
    device: str = "cpu",
    should_stop: Callable[[], bool] | None = None,
    lpips_weights: Path | None = None,
    *,
    on_step: Callable[[int, float], None] | None = None,
    data_store: DataStore | dict[str, Any] | None = None,
) -> Iterator[dict[str, Any]]:
    """Train `spec` on `device`, yielding one record per checkpoint (every schedule.checkpoint_every
    steps and at the last step). Resumes from the latest checkpoint in out_dir. When should_stop()
    turns true, writes a final checkpoint, yields its record (final=True) and returns.

    on_step(step, loss) is called after every optimizer step (the CLI's progress bar); it costs a
    device sync per step, so the Ray worker leaves it None. data_store: how this node reaches data.url
    (storage options and its data cache; worker.data_fetch.DataStore): the shards are fetched and
    verified before anything is built, and every record says what the fetch did (`data_fetch`).
    """
    with deterministic_algorithms(spec.precision.deterministic):
        yield from _train(spec, out_dir, device, should_stop, lpips_weights, on_step, data_store)


def _train(
    spec: ArmSpec,
    out_dir: Path,
    device: str,
    should_stop: Callable[[], bool] | None,
    lpips_weights: Path | None,
    on_step: Callable[[int, float], None] | None,
    data_store: DataStore | dict[str, Any] | None,
) -> Iterator[dict[str, Any]]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dev = torch.device(device)
    if dev.type == "cuda":
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    t_start = time.perf_counter()
    # The checkpoint is read before build: a resumed FP8 run converts the linears it started with, and
    # trains with the micro-batch it started with.
    latest = ckpt.latest_checkpoint(out_dir)
    state: dict[str, Any] | None = None
    if latest is not None:
        # CPU first: RNG states must stay CPU ByteTensors; load_state_dict copies tensors to the device.
        state = ckpt.load(latest, map_location="cpu")
        check_resumable(state["spec"], spec, latest)
    saved = state or {}
    # The prepared manifest this run started on: a resume (here or on another node) trains on it or not at all.
    pin = (saved.get("record") or {}).get("data_manifest_sha256")
    fetched = None
    if spec.data.url is not None:
        store = data_store if isinstance(data_store, DataStore) else DataStore.from_dict(data_store)
        fetched = fetch_prepared(spec.data.url, store, pin=pin)
    try:
        parts = build(
            spec,
            dev,
            lpips_weights,
            fp8_linears=saved.get("fp8_linears"),
            micro_batch=saved.get("micro_batch"),
            data_root=Path(fetched.path) if fetched is not None else None,
            data_pin=pin,
        )
    except torch.OutOfMemoryError:
        raise TrainError(
            oom_message(spec.schedule.fixed_micro_batch() or 1, spec.schedule.batch_size, dev, "set-up")
        ) from None
    sched = spec.schedule
    gens = {"noise": torch.Generator(device=dev).manual_seed(spec.data.seed + 2)}
    workers = spec.data.loader_workers if spec.data.loader_workers != "auto" else auto_workers(dev.type)
    info = {**device_info(dev), "loader_workers": workers, "deterministic": spec.precision.deterministic}
    if fetched is not None:
        info["data_fetch"] = fetched.as_record()
    if (manifest_sha := getattr(parts.dataset, "manifest_sha256", None)) is not None:
        info["data_manifest_sha256"] = manifest_sha
    checkpoints = Checkpoints(parts, out_dir, gens, t_start=t_start, info=info)
    # Images found unreadable at start are already left out; mid-run failures join them (one limit).
    ds = parts.dataset
    checkpoints.skips = (
        ds.unreadable
        if isinstance(ds, CaptionedDataset)
        else Unreadable(len(ds), spec.data.max_unreadable, ds.name)
    )
    step = checkpoints.restore(state) if state is not None else 0
    if checkpoints.last_record is not None and step >= sched.steps:
        yield {**checkpoints.last_record, "final": True}
        return

    batches = StepBatches(parts.dataset, sched.batch_size, parts.micro_batch, spec.data.seed + 1, IDENTITY_PROB)
    loader = iter(make_loader(batches, step, sched.steps, workers, pin=dev.type == "cuda"))
    window = Window.empty(dev)
    steps_this_process = 0
    try:
        while step < sched.steps:
            if should_stop is not None and should_stop():
                yield checkpoints.final(step, window)
                return
            if steps_this_process == WARMUP_STEPS:
                window.start_timing()
            t_wait = time.perf_counter()
            micro_batches = [next(loader) for _ in range(parts.grad_accum)]
            wait_s = time.perf_counter() - t_wait
            for mb in micro_batches:
                checkpoints.skips.add(mb.skipped)
            t_step = time.perf_counter()
            loss, gnorm = train_step(parts, step, micro_batches, gens["noise"])
            if steps_this_process == 0 and parts.compiled:
                _sync(dev)
                checkpoints.compile_s = time.perf_counter() - t_step
            step += 1
            steps_this_process += 1
            window.add(loss, gnorm, wait_s)
            if on_step is not None:
                on_step(step, loss.item())
            if step % sched.checkpoint_every == 0 or step == sched.steps:
                yield checkpoints.save(step, window, final=step == sched.steps)
                window = Window.empty(dev, timing=window.t_timing is not None)
    except torch.OutOfMemoryError:
        raise TrainError(
            oom_message(parts.micro_batch, sched.batch_size, dev, f"training step {step + 1} or its evaluation")
        ) from None
