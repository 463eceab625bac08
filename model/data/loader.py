"""Feeding the training loop from loader worker processes, never from the training thread.

Item k of the stream is micro-batch j = k % grad_accum of optimizer step s = k // grad_accum: the slice
[j * micro, (j + 1) * micro) of `step_indices(seed, s, batch_size)`. Every item is a pure function of
(data seed, step, micro index), so the stream is the same with 0 or 8 workers and after a resume, and
the global batch of a step does not depend on the micro-batch size. torch's DataLoader returns items
in sampler order whatever the worker count; its workers decode and resize, a pin-memory thread pins,
and the trainer copies with non_blocking=True, so decoding and the copy overlap the GPU's work.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from model.data.base import ImageCaptionDataset, identity_draw, step_indices

MAX_AUTO_WORKERS = 8  # past this a folder of 1024 px JPEGs already outruns one GPU (docs/benchmarks.md)
PREFETCH_FACTOR = 4  # items queued per worker: absorbs a slow file without the GPU waiting


@dataclass
class MicroBatch:
    step: int
    micro: int
    images: Tensor  # (m, 3, R, R) uint8 or float32 in [0, 1], on CPU (pinned when the loader pins)
    captions: list[str]
    identity: bool  # condition this micro-batch on the targets' identity tokens
    skipped: list[str] = field(default_factory=list)  # files replaced because they failed to decode

    def pin_memory(self) -> MicroBatch:
        """Called by the DataLoader's pin-memory thread."""
        self.images = self.images.pin_memory()
        return self


class StepBatches(Dataset):
    """Map-style view of the run's micro-batches: item k = micro-batch k % accum of step k // accum.

    Data-parallel (ranks > 1): micro-batch j of a step spans ranks * micro images, and rank r takes its
    r-th slice of them. So the ranks together see what one process with micro-batch ranks * micro sees,
    micro-batch by micro-batch, identity draw included (worker/world.py draws the noise the same way).
    """

    def __init__(
        self,
        dataset: ImageCaptionDataset,
        batch_size: int,
        micro_batch: int,
        seed: int,
        identity_prob: float,
        rank: int = 0,
        ranks: int = 1,
    ) -> None:
        if batch_size % (micro_batch * ranks):
            raise ValueError(f"micro-batch {micro_batch} x {ranks} ranks does not divide the batch {batch_size}")
        self.dataset, self.batch_size, self.micro = dataset, batch_size, micro_batch
        self.rank, self.ranks = rank, ranks
        self.accum = batch_size // (micro_batch * ranks)
        self.seed, self.identity_prob = seed, identity_prob

    def __getitem__(self, k: int) -> MicroBatch:
        step, j = divmod(k, self.accum)
        idx = step_indices(self.seed, step, self.batch_size, self.dataset.num_train)
        start = (j * self.ranks + self.rank) * self.micro
        images, captions, skipped = self.dataset.load_train(idx[start : start + self.micro].tolist())
        return MicroBatch(step, j, images, captions, identity_draw(self.seed, step, j, self.identity_prob), skipped)


def cpus_available() -> int:
    """CPUs this process may run on (its affinity mask: a container's or taskset's limit)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def gpus_on_node() -> int:
    """GPUs of the whole node, not just the one Ray made visible: the arms that share its CPUs.

    /proc/driver/nvidia/gpus has one entry per GPU whatever CUDA_VISIBLE_DEVICES says.
    """
    proc = Path("/proc/driver/nvidia/gpus")
    if proc.is_dir():
        return max(1, len(list(proc.iterdir())))
    return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1


def auto_workers(device_type: str, cpus: int | None = None, gpus: int | None = None) -> int:
    """Loader workers for one arm: its share of the node's CPUs (one arm per GPU) less one for the
    training thread, at least 1, at most MAX_AUTO_WORKERS. On CPU training the math uses the cores,
    so one worker only takes loading off the training thread."""
    if device_type != "cuda":
        return 1
    cpus = cpus_available() if cpus is None else cpus
    gpus = gpus_on_node() if gpus is None else gpus
    return max(1, min(MAX_AUTO_WORKERS, cpus // max(1, gpus) - 1))


def make_loader(batches: StepBatches, start_step: int, steps: int, workers: int, pin: bool) -> DataLoader:
    """The run's single pass over steps [start_step, steps): one epoch, so the workers live as long as the
    run (persistent by construction) and start once."""
    order = range(start_step * batches.accum, steps * batches.accum)
    return DataLoader(
        batches,
        batch_size=None,  # items are micro-batches already
        sampler=order,
        num_workers=workers,
        pin_memory=pin,
        prefetch_factor=PREFETCH_FACTOR if workers > 0 else None,
        persistent_workers=workers > 0,
        # Its own generator: the DataLoader draws its workers' base seed when iterated, and from the
        # global RNG that would shift TREAD's permutations between a fresh and a resumed run.
        generator=torch.Generator(),
    )
