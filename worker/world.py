"""The ranks of one data-parallel arm as the training loop sees them: who writes, and the few collectives.

One arm on N GPUs of a node (spec `gpus: N`, started by worker/ranks.py) trains as N processes, one per GPU,
that hold identical weights, optimizer state and RNG states: every rank builds the same model from the
same seed and draws the same noise. Each step, rank r trains on its slice of the global batch
(model/data/loader.py StepBatches), then the gradients and the loss are averaged over the ranks in one
bucketed all-reduce after the last micro-batch, so clipping, the optimizer and the EMA see what one
process training the whole batch sees, and the ranks stay identical without ever exchanging weights.

This is DDP's arithmetic (`no_sync` during accumulation, one bucketed all-reduce at the end) without its
module wrapper: the trainer's parameters live in three modules (NanoDiT, a trained text encoder, REPA's
projector), and micro-batches without identity conditioning leave parameters unused, which the wrapper
handles only with find_unused_parameters. Rank 0 alone evaluates and writes (checkpoints, records,
samples); worker/ranks.py hands its records to the actor. One rank (size 1) is the plain trainer: every
method is then free. Imports torch only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

# Gradients are all-reduced in buckets of about this size: few collectives, bounded extra memory.
BUCKET_BYTES = 64 << 20


@dataclass
class World:
    """This process's rank among `size` ranks; `control` is a gloo group for host-side agreements (stop,
    checks), so agreeing never waits on the GPU's queue."""

    rank: int = 0
    size: int = 1
    backend: str | None = None  # nccl | gloo; None for one rank
    control: Any = field(default=None, repr=False)

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that evaluates, writes and reports."""
        return self.rank == 0

    @classmethod
    def join(cls, rank: int, size: int, init_file: str, device: torch.device, timeout_s: float) -> World:
        """Join the arm's process group (a file store: no port to pick or to collide on)."""
        import datetime

        import torch.distributed as dist

        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=size, timeout=timeout)
        control = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else dist.group.WORLD
        return cls(rank, size, backend, control)

    def leave(self) -> None:
        if self.size > 1:
            import torch.distributed as dist

            dist.destroy_process_group()

    # -- the slice of what one process would draw -------------------------------------------------------

    def my_slice(self, full: Tensor) -> Tensor:
        """Rows of `full` (drawn for size x n samples, the same on every rank) that belong to this rank."""
        n = full.shape[0] // self.size
        return full[self.rank * n : (self.rank + 1) * n]

    # -- collectives ------------------------------------------------------------------------------------

    def agree(self, flag: bool) -> bool:
        """True on every rank when it is true on any (a stop request reaches rank 0 only)."""
        if self.size == 1:
            return flag
        import torch.distributed as dist

        t = torch.tensor([int(flag)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.control)
        return bool(t.item())

    def smallest(self, value: int) -> int:
        """The smallest of the ranks' values (the micro-batch every rank can fit)."""
        if self.size == 1:
            return value
        import torch.distributed as dist

        t = torch.tensor([value])
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.control)
        return int(t.item())

    def check_same(self, value: int, what: str) -> None:
        """Fail every rank at once when the ranks disagree on `value`, instead of a mismatched collective."""
        if self.size == 1:
            return
        import torch.distributed as dist

        t = torch.tensor([value, -value])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.control)
        high, low = int(t[0]), -int(t[1])
        if high != low:
            raise RuntimeError(f"the ranks disagree on {what}: from {low} to {high}")

    def average(self, tensors: list[Tensor]) -> None:
        """Replace each tensor by its mean over the ranks, in place (bucketed by dtype and device)."""
        if self.size == 1 or not tensors:
            return
        import torch.distributed as dist
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        for bucket in _buckets(tensors):
            flat = _flatten_dense_tensors(bucket)
            dist.all_reduce(flat)  # SUM: gloo has no AVG
            flat.div_(self.size)
            for t, reduced in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
                t.copy_(reduced)

    def average_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Average the gradients the ranks hold. Unused parameters (no identity conditioning in any
        micro-batch of the step) have no gradient on every rank alike: the identity draw is the same for
        all ranks, so the optimizer skips the same parameters as one process would."""
        grads = [p.grad for p in params if p.grad is not None]
        self.check_same(len(grads), "which parameters have gradients")
        self.average(grads)

    def broadcast(self, tensors: list[Tensor]) -> None:
        """Rank 0's values everywhere (the start: identical by construction, made certain)."""
        if self.size == 1:
            return
        import torch.distributed as dist

        for t in tensors:
            dist.broadcast(t.data, src=0)


def _buckets(tensors: list[Tensor]) -> list[list[Tensor]]:
    groups: dict[tuple[torch.dtype, torch.device], list[list[Tensor]]] = {}
    filled: dict[tuple[torch.dtype, torch.device], int] = {}
    for t in tensors:
        key, size = (t.dtype, t.device), t.numel() * t.element_size()
        runs = groups.setdefault(key, [[]])
        if runs[-1] and filled.get(key, 0) + size > BUCKET_BYTES:
            runs.append([])
            filled[key] = 0
        runs[-1].append(t)
        filled[key] = filled.get(key, 0) + size
    return [bucket for runs in groups.values() for bucket in runs]
