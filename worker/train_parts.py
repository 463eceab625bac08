"""Building a run's parts before its first step: dataset, text encoder, NanoDiT (+ precision, REPA,
AsymFlow basis), optimizers, EMA and LPIPS, and the check that a checkpoint may be resumed with a spec.

The training loop (worker/train.py) calls `build` once per process; benchmarks call it to build an arm
exactly as the trainer does. Imports model/ only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from model.data import ImageCaptionDataset, build_dataset
from model.evaluate import NO_EDITS_NOTE
from model.flow import FlowMatching, estimate_pca_basis
from model.nanodit import NanoDiT
from model.optim import EMA, OptimizerStep, build_optimizers
from model.perceptual import LPIPSMetric, load_lpips
from model.precision import apply_precision, autocast_ctx
from model.repa import RepaProjector, Teacher, build_teacher
from model.spec import STANDIN, ArmSpec
from model.text import TextEncoder, build_text_encoder
from worker.micro_batch import MicroBatchChoice, choose_micro_batch
from worker.world import World

# Images used once to estimate AsymFlow's patch PCA basis (fixed seed: the basis is a function of the data).
PCA_IMAGES = 256
PCA_SEED = 0
CPU_BF16_FALLBACK = "bf16 autocast not used on CPU (about 2x slower than fp32 there): fp32"
REPA_STANDIN_FALLBACK = f"repa teacher: {STANDIN} (no pretrained teacher; REPA aligns to a frozen random network)"
LPIPS_STANDIN_FALLBACK = f"lpips backbone: {STANDIN} (metrics are not comparable with real LPIPS)"
# Spec sections that may change between a checkpoint and its resume (they do not touch training). `gpus`:
# every rank draws the whole global batch and its noise and takes its slice (worker/world.py), so a
# checkpoint written on g GPUs resumes on g' with the same global batch (the spec checks that g' divides
# it) and the same arithmetic: an arm grown onto freed GPUs (orchestrator/runs/grow.py).
RESUMABLE_CHANGES = {"name", "description", "detector", "gpus"}



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
    world: World = field(default_factory=World)  # this rank of a data-parallel arm (one rank: the plain trainer)

    @property
    def micro_batch(self) -> int:
        assert self.micro is not None
        return self.micro.size

    @property
    def grad_accum(self) -> int:
        """Micro-batches per step on each rank."""
        return self.spec.rank_batch() // self.micro_batch


def has_trainable(module: nn.Module) -> bool:
    return any(p.requires_grad for p in module.parameters())


def _shared(shared: dict[str, Any] | None, key: tuple, make: Callable[[], Any]) -> Any:
    """`make()`, kept in `shared` under `key` and reused from there (None: made each time)."""
    if shared is None:
        return make()
    if key not in shared:
        shared[key] = make()
    return shared[key]


def build(
    spec: ArmSpec,
    device: torch.device,
    lpips_weights: Path | None,
    fp8_linears: list[str] | None = None,
    micro_batch: int | None = None,
    data_root: Path | None = None,
    data_pin: str | None = None,
    world: World | None = None,
    shared: dict[str, Any] | None = None,
) -> Parts:
    """Construct a run's parts; model init uses the global RNG seeded from data.seed.

    fp8_linears: the FP8 set saved in the checkpoint being resumed (None on a fresh start): converted as
    is, without re-timing, so the resumed run keeps the numerics it started with. micro_batch: likewise
    the micro-batch the resumed run trained with (not searched again). data_root: the local copy of
    data.url (fetched by train_arm), else None. data_pin: the sha256 of the prepared manifest the resumed
    run started on (its checkpoint record's data_manifest_sha256): a different one is refused. world: this
    rank of a data-parallel arm; the ranks agree on the smallest micro-batch any of them fits. shared: parts
    kept across calls in one process and reused where their spec is the same (an evaluation job scoring
    several runs: the LPIPS network, the dataset); None: everything built anew.
    """
    world = world or World()
    torch.manual_seed(spec.data.seed)
    fallbacks: list[str] = []
    dataset = _shared(shared, ("dataset", spec.data.model_dump_json(), str(data_root), data_pin),
                      lambda: build_dataset(spec, data_root, data_pin))
    if not dataset.supports_edits:  # known now, so the first record already says so
        fallbacks.append(NO_EDITS_NOTE)
    # LPIPS and the teacher first: a missing weights file should fail before any work is done.
    lpips_key = ("lpips", spec.eval.lpips_backbone, spec.eval.lpips_weights, str(lpips_weights), str(device))
    lpips = _shared(shared, lpips_key, lambda: load_lpips(spec.eval, weights=lpips_weights, device=str(device)))
    if lpips.label == STANDIN:
        fallbacks.append(LPIPS_STANDIN_FALLBACK)
    text_encoder = build_text_encoder(spec, dataset).to(device)
    dims = spec.model.dims()
    model = NanoDiT(spec, text_dim=text_encoder.dim).to(device)

    teacher = projector = None
    repa_block = None
    if spec.repa.enabled:
        teacher = build_teacher(spec.repa, device)
        if teacher.label == STANDIN:
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
        if has_trainable(text_encoder):
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
    if (agreed := world.smallest(micro.size)) != micro.size:
        micro = MicroBatchChoice(agreed, f"{micro.how}; {agreed}: the smallest of {world.size} ranks", micro.note)
    if micro.note:
        fallbacks.append(micro.note)
    if precision.compile_mode == "reduce-overhead" and micro.size != spec.rank_batch():
        fallbacks.append(
            f"compile_mode reduce-overhead needs one micro-batch per step; micro-batch {micro.size} of "
            f"{spec.rank_batch()}: compile_mode default"
        )
        precision = precision.model_copy(update={"compile_mode": "default"})
    micro_tokens = micro.size * (spec.resolution() // dims.patch) ** 2
    # FP8 autotune times at this size (unless the set comes from the checkpoint)
    report = apply_precision(model, precision, device, tokens=micro_tokens, fp8_linears=fp8_linears)
    fallbacks.extend(report.fallbacks)

    extra: list[tuple[str, nn.Parameter]] = []
    if has_trainable(text_encoder):
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
        world=world,
    )
