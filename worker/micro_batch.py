"""The micro-batch: the largest divisor of the global batch whose forward + backward fits the GPU.

Found by trial steps at start, as Hugging Face accelerate's `find_executable_batch_size` does, but
halving over the batch's divisors (so gradient accumulation = batch / micro-batch is whole and the
global batch stays the spec's) and keeping room for what a trial does not allocate yet: the
optimizer's moments (8 bytes per trainable parameter for AdamW) and a margin for compile's buffers
and fragmentation. On CPU the whole batch is one micro-batch (memory is not the limit there).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from model.data import ImageCaptionDataset
from model.repa import Teacher
from model.spec import ArmSpec
from model.text import TextEncoder

# Share of the GPU's memory kept free beyond a trial's peak: torch.compile's and CUDA graphs' own
# buffers, allocator fragmentation, and the evaluation's sampler batches.
MARGIN = 0.10
OPTIMIZER_BYTES_PER_PARAM = 8  # AdamW: two fp32 moments (Muon keeps one: an over-estimate there)


class DoesNotFitError(ValueError):
    """Even one image per micro-batch does not fit the GPU."""


@dataclass(frozen=True)
class MicroBatchChoice:
    size: int
    how: str  # "spec", "checkpoint", "cpu: the whole batch", "auto: ..." (on the record)
    note: str | None = None  # a fallback worth listing on the run, if any


def divisors_desc(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def halving_candidates(batch: int) -> list[int]:
    """batch, then the largest divisor at most half the previous, down to 1: 256, 128, ..., 1; 10, 5, 2, 1."""
    out = [batch]
    divs = divisors_desc(batch)
    while out[-1] > 1:
        out.append(next(d for d in divs if d <= out[-1] // 2))
    return out


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def oom_message(micro: int, batch: int, device: torch.device, where: str) -> str:
    """The error a run gets instead of a raw CUDA out-of-memory traceback."""
    total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 0
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    return (
        f"CUDA out of memory during {where} at micro-batch {micro} (of batch {batch}) on a GPU with {gib(total)} "
        f"(peak allocated {gib(peak)}): set schedule.micro_batch lower than {micro} (or leave it auto, the "
        "default, which measures what fits), or lower data.resolution or the model size; other processes on "
        "the GPU also take its memory"
    )


def _trial(
    m: int,
    spec: ArmSpec,
    device: torch.device,
    model: nn.Module,
    text_encoder: TextEncoder,
    caption: str,
    autocast: Callable[[], contextlib.AbstractContextManager],
    teacher: Teacher | None,
    repa_block: int | None,
) -> int | None:
    """Peak bytes of one forward + backward at micro-batch m, or None if it ran out of memory.

    Leaves no gradients and no state behind (the trial's input is random, the weights are untouched).
    """
    res = spec.resolution()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    try:
        x = torch.rand(m, 3, res, res, device=device)
        t = torch.rand(m, device=device)
        with autocast():
            text, mask = text_encoder([caption] * m)
            out = model(x, t, text.to(device), text_mask=mask.to(device), identity=x, repa_block=repa_block)
            loss = out.out.float().square().mean()
            if teacher is not None and out.hidden is not None:  # REPA: the teacher's pass and the hidden states
                teacher.features(x, (res // spec.model.dims().patch,) * 2)
                loss = loss + out.hidden.float().square().mean()
        loss.backward()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)
    except torch.OutOfMemoryError:
        return None
    finally:
        for mod in (model, text_encoder):
            mod.zero_grad(set_to_none=True)
        x = t = text = mask = out = loss = None  # noqa: F841 - drop references before freeing
        gc.collect()
        torch.cuda.empty_cache()


def resumed_micro_batch(saved: int | None, saved_ranks: int, spec: ArmSpec) -> int | None:
    """The micro-batch a checkpoint resumes with: the one it trained with, or, resumed on another number of
    GPUs (an arm grown onto freed ones), the images one micro-batch spanned over all its ranks split among
    the new ranks, so every step's micro-batches, noise and identity draws are the uninterrupted run's
    (model/data/loader.py StepBatches). None (chosen afresh, as at a start) where that split is not whole,
    or would put more images on a GPU than it held before (fewer GPUs: what fits is measured again)."""
    if saved is None or saved_ranks == spec.gpus:
        return saved
    images = saved * saved_ranks
    if images % spec.gpus or images // spec.gpus > saved:
        return None
    return images // spec.gpus


def choose_micro_batch(
    spec: ArmSpec,
    device: torch.device,
    model: nn.Module,
    text_encoder: TextEncoder,
    dataset: ImageCaptionDataset,
    autocast: Callable[[], contextlib.AbstractContextManager],
    teacher: Teacher | None,
    repa_block: int | None,
    fixed: int | None = None,
) -> MicroBatchChoice:
    """The run's micro-batch: a resumed checkpoint's, the spec's, the whole batch on CPU, else trials.
    The batch is one rank's share (spec.rank_batch(): all of it on one GPU)."""
    batch = spec.rank_batch()
    if fixed is not None:
        return MicroBatchChoice(fixed, "checkpoint")
    spec_micro = spec.schedule.fixed_micro_batch()
    if spec_micro is not None:
        return MicroBatchChoice(spec_micro, "spec")
    if device.type != "cuda":
        return MicroBatchChoice(batch, "cpu: the whole batch")
    total = torch.cuda.get_device_properties(device).total_memory
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    params += sum(p.numel() for p in text_encoder.parameters() if p.requires_grad)
    budget = total * (1 - MARGIN) - params * OPTIMIZER_BYTES_PER_PARAM
    caption = dataset.held_out(1)[1][0]
    tried: list[str] = []
    was_training = model.training
    model.train()
    try:
        for m in halving_candidates(batch):
            peak = _trial(m, spec, device, model, text_encoder, caption, autocast, teacher, repa_block)
            if peak is not None and peak <= budget:
                tried.append(f"{m} fits ({gib(peak)} peak)")
                how = f"auto on {gib(total)}: " + ", ".join(tried)
                note = None if m == batch else f"micro-batch {m} x {batch // m} accumulation steps (auto: {tried[-2]})"
                return MicroBatchChoice(m, how, note)
            tried.append(f"{m} out of memory" if peak is None else f"{m} over budget ({gib(peak)} peak)")
    finally:
        model.train(was_training)
        torch.cuda.reset_peak_memory_stats(device)
    raise DoesNotFitError(
        f"not even micro-batch 1 fits this GPU: {'; '.join(tried)}; budget {gib(budget)} of {gib(total)} after the "
        "optimizer state and a 10% margin; lower data.resolution or the model size, or use a larger GPU"
    )
