"""The training loop: one arm on one device, one metric record per checkpoint.

`train_arm` builds the arm's parts (worker/train_parts.py: dataset, text encoder, NanoDiT with
precision, REPA and the AsymFlow basis, optimizers and EMA), resumes from the latest checkpoint in
out_dir if there is one, and trains, yielding a record at every checkpoint (worker/train_record.py).
A resumed run continues exactly (bit-identical on CPU): the checkpoint holds the model, EMA,
optimizers, the global torch RNG (TREAD's permutations), the flow-noise generator and the micro-batch;
the data stream is a pure function of (data seed, step), served by loader worker processes
(model/data/loader.py). Imports model/ and worker/ only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from model.data import as_unit_float
from model.data.captioned import CaptionedDataset
from model.data.loader import MicroBatch, StepBatches, auto_workers, make_loader
from model.data.unreadable import Unreadable
from model.flow import interpolate, sample_t
from model.optim import lr_at, set_lr
from model.precision import deterministic_algorithms
from model.repa import repa_loss, repa_weight
from model.spec import ArmSpec
from worker import checkpoint as ckpt
from worker.compile_cache import CompileCache, cache_key
from worker.data_fetch import DataStore, fetch_prepared
from worker.distribution import DistributionPass
from worker.evaluation import evaluate_in_training
from worker.micro_batch import oom_message, resumed_micro_batch
from worker.train_parts import (  # noqa: F401 - LPIPS_STANDIN_FALLBACK and REPA_STANDIN_FALLBACK: read through here
    LPIPS_STANDIN_FALLBACK,
    REPA_STANDIN_FALLBACK,
    Parts,
    TrainError,
    build,
    check_resumable,
)
from worker.train_record import Checkpoints, Window, device_info, sync_device
from worker.world import World

# Steps after each (re)start excluded from iter/s: compile, cudnn autotune, allocator warm-up.
WARMUP_STEPS = 3
# Probability that a training step conditions on the target's identity tokens. The metrics need both
# modes: recon LPIPS generates with identity tokens, text-only LPIPS without them.
IDENTITY_PROB = 0.5



# --- one optimizer step ----------------------------------------------------------------------------


def train_step(parts: Parts, step: int, batches: list[MicroBatch], noise_gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """One optimizer step over its micro-batches (grad accumulation); returns (loss, grad_norm) as 0-d
    tensors (no sync)."""
    spec, dev, world = parts.spec, parts.device, parts.world
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
        # Drawn for the micro-batch of all ranks (the same on each) and sliced: the noise of an image
        # does not depend on how many GPUs train the arm.
        n = len(captions) * world.size
        t = world.my_slice(sample_t(n, spec.flow, noise_gen, dev))
        eps = world.my_slice(torch.randn((n, *x0.shape[1:]), generator=noise_gen, device=dev))
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
    world.average_grads(parts.trainable)
    world.average([total])
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
    world: World | None = None,
    compile_cache: dict[str, Any] | None = None,
    end_evaluation: dict[str, Any] | None = None,
) -> Iterator[dict[str, Any]]:
    """Train `spec` on `device`, yielding one record per checkpoint (every schedule.checkpoint_every
    steps and at the last step). Resumes from the latest checkpoint in out_dir. When should_stop()
    turns true, writes a final checkpoint, yields its record (final=True) and returns.

    on_step(step, loss) is called after every optimizer step (the CLI's progress bar); it costs a
    device sync per step, so the Ray worker leaves it None. data_store: how this node reaches data.url
    (storage options and its data cache; worker.data_fetch.DataStore): the shards are fetched and
    verified before anything is built, and every record says what the fetch did (`data_fetch`).
    world: this rank of a data-parallel arm (worker/ranks.py starts them); only rank 0 writes and yields.
    compile_cache: worker.compile_cache.CompileCache as a dict (the node's cache directory, and a store a
    compiled arm loads its artefacts from and saves them to; records say which: `compile_cache`).
    end_evaluation: worker/protocol.py EndEvaluation as a dict (a deciding grid's run): at the last step, the
    final checkpoint is also evaluated on its images with the model loaded, on the final record
    (worker/evaluation.py evaluate_in_training), so no evaluation job has to start for it.
    """
    cache = CompileCache.from_dict(compile_cache) if compile_cache is not None else None
    with deterministic_algorithms(spec.precision.deterministic):
        yield from _train(
            spec, out_dir, device, should_stop, lpips_weights, on_step, data_store, world or World(), cache,
            end_evaluation,
        )


def _train(
    spec: ArmSpec,
    out_dir: Path,
    device: str,
    should_stop: Callable[[], bool] | None,
    lpips_weights: Path | None,
    on_step: Callable[[int, float], None] | None,
    data_store: DataStore | dict[str, Any] | None,
    world: World,
    cache: CompileCache | None,
    end_evaluation: dict[str, Any] | None = None,
) -> Iterator[dict[str, Any]]:
    out_dir = Path(out_dir)
    if cache is not None:
        cache.use_node_dirs()  # before anything compiles (FP8 autotune, the model, the optimizer step)
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
            # written on as many GPUs, or on fewer (an arm grown since): the same images per micro-batch
            micro_batch=resumed_micro_batch(saved.get("micro_batch"), (saved.get("spec") or {}).get("gpus", 1), spec),
            data_root=Path(fetched.path) if fetched is not None else None,
            data_pin=pin,
            world=world,
        )
    except torch.OutOfMemoryError:
        raise TrainError(
            oom_message(spec.schedule.fixed_micro_batch() or 1, spec.rank_batch(), dev, "set-up")
        ) from None
    sched = spec.schedule
    gens = {"noise": torch.Generator(device=dev).manual_seed(spec.data.seed + 2)}
    workers = spec.data.loader_workers if spec.data.loader_workers != "auto" else auto_workers(dev.type)
    info = {
        **device_info(dev),
        "loader_workers": workers,
        "deterministic": spec.precision.deterministic,
        "ranks": world.size,  # GPUs training the arm data-parallel (worker/world.py)
    }
    if fetched is not None:
        info["data_fetch"] = fetched.as_record()
    if (manifest_sha := getattr(parts.dataset, "manifest_sha256", None)) is not None:
        info["data_manifest_sha256"] = manifest_sha
    compiled_for = None  # the compile cache's key ingredients, for a compiled run with a cache
    if cache is not None and parts.compiled:
        compiled_for = cache_key(spec, info["device_name"], parts.micro_batch, parts.fp8_linears)
        cache.load(compiled_for)
        info["compile_cache"] = cache.status  # the same dict, completed after the warm-up steps
    checkpoints = Checkpoints(parts, out_dir, gens, t_start=t_start, info=info)
    if spec.eval.distribution.metrics:  # references kept beside the compile cache: the node's, outliving runs
        checkpoints.distribution = DistributionPass(spec, dev, Path(cache.dir).parent if cache else out_dir)
    # Images found unreadable at start are already left out; mid-run failures join them (one limit).
    ds = parts.dataset
    checkpoints.skips = (
        ds.unreadable
        if isinstance(ds, CaptionedDataset)
        else Unreadable(len(ds), spec.data.max_unreadable, ds.name)
    )
    step = checkpoints.restore(state, write=world.is_main) if state is not None else 0
    world.broadcast(parts.trainable)  # identical by construction (same seed, same checkpoint): made certain
    if checkpoints.last_record is not None and step >= sched.steps:
        if world.is_main:
            yield {**checkpoints.last_record, "final": True}
        return

    batches = StepBatches(
        parts.dataset, sched.batch_size, parts.micro_batch, spec.data.seed + 1, IDENTITY_PROB, world.rank, world.size
    )
    loader = iter(make_loader(batches, step, sched.steps, workers, pin=dev.type == "cuda"))
    window = Window.empty(dev)
    steps_this_process = 0
    try:
        while step < sched.steps:
            if world.agree(should_stop is not None and should_stop()):
                if world.is_main:
                    yield checkpoints.final(step, window)
                return
            if steps_this_process == WARMUP_STEPS:
                if cache is not None and compiled_for is not None:  # everything has compiled by now
                    cache.finish(compiled_for, write=world.is_main)
                window.start_timing()
            t_wait = time.perf_counter()
            micro_batches = [next(loader) for _ in range(parts.grad_accum)]
            wait_s = time.perf_counter() - t_wait
            for mb in micro_batches:
                checkpoints.skips.add(mb.skipped)
            t_step = time.perf_counter()
            loss, gnorm = train_step(parts, step, micro_batches, gens["noise"])
            if steps_this_process == 0 and parts.compiled:
                sync_device(dev)
                checkpoints.compile_s = time.perf_counter() - t_step
            step += 1
            steps_this_process += 1
            window.add(loss, gnorm, wait_s)
            if on_step is not None:
                on_step(step, loss.item())
            if step % sched.checkpoint_every == 0 or step == sched.steps:
                if world.is_main:  # the other ranks go on to the next step's all-reduce and wait there
                    record = checkpoints.save(step, window, final=step == sched.steps)
                    if step == sched.steps and end_evaluation:  # the model loaded: its evaluation, no new start
                        record = {**record, **evaluate_in_training(parts, record, end_evaluation)}
                    yield record
                window = Window.empty(dev, timing=window.t_timing is not None)
    except torch.OutOfMemoryError:
        raise TrainError(
            oom_message(parts.micro_batch, spec.rank_batch(), dev, f"training step {step + 1} or its evaluation")
        ) from None
