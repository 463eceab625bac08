"""Evaluate one stored checkpoint of a run again, on more held-out images, without a training step.

A run-like job (orchestrator/runs/evaluation_jobs.py places it like a run): the node's agent starts an
`ArmWorker` whose args carry `evaluation` (worker/protocol.py EvaluationArgs), and the worker runs
`evaluate_arm` in place of `train_arm`. It yields one record, the checkpoint's step with the metrics
`model/evaluate.py` computes on the first `images` held-out images, each with the noise seeded by its index,
so image i is measured with the same noise in every arm, seed and evaluation, and in training's own.

The checkpoint is read from the run's directory where this node holds it (`ckpt_<step>.pt`, or `best.pt`
when that is the step), else from the run's checkpoint storage, copied into this job's own directory.
Nothing of the run's directory is written.

`measures` (the evaluation's per-image metrics; None: every one) without an LPIPS metric measures the flow loss
alone: none of the LPIPS metrics' sampling (a deciding grid's look on the flow loss, grids/deciding.py).

A deciding grid's training job scores its last checkpoint the same way at its end (`evaluate_in_training`, the
same `score`), with the model still loaded: no second start (orchestrator/runs/in_training.py).

With `samples` and `metrics` (the distribution metrics, worker/distribution.py) it also generates that many
samples, sample i from the same prompt and noise as in every run and in training's own passes, and scores them
with the final extractors against the held-out split's reference features (read from the node or the store
where an earlier pass left them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from model.evaluate import evaluate
from model.spec import ArmSpec
from worker import checkpoint as ckpt
from worker.distribution import DistributionPass
from worker.failure import describe_error
from worker.protocol import EVALUATION_ERROR, IN_TRAINING_ERROR, IN_TRAINING_RECORD
from worker.run_files import BEST_NAME, ckpt_name
from worker.train_parts import Parts, build
from worker.train_record import EVAL_BATCH, restore_parts

LPIPS_KEYS = ("recon_lpips", "text_lpips", "text_manip_delta")  # asked for none: the flow loss alone, no sampling
SOURCE_NAME = "source.pt"  # a checkpoint copied from storage into the job's directory


class NoCheckpoint(FileNotFoundError):
    """The step asked for is neither in the run's directory on this node nor in its storage."""


def _stored_copy(storage: dict[str, Any], step: int, out_dir: Path) -> Path | None:
    from worker.checkpoint_store import StoreConfig, open_fs
    from worker.stored_file import get_stored

    config = StoreConfig.from_dict(storage)
    fs, root = open_fs(config.url, config.options)
    for name in (ckpt_name(step), BEST_NAME):
        if fs.exists(f"{root}/{name}"):
            out_dir.mkdir(parents=True, exist_ok=True)
            dest = out_dir / SOURCE_NAME
            get_stored(fs, root, f"{root}/{name}", dest)
            state = ckpt.load(dest)
            if state.get("step") == step:
                return dest
    return None


def find_checkpoint(source_dir: Path, step: int, storage: dict[str, Any] | None, out_dir: Path) -> Path:
    """The checkpoint file of `step`: in the run's directory, else copied from storage; NoCheckpoint else."""
    if (periodic := source_dir / ckpt_name(step)).is_file():  # its name says its step
        return periodic
    for path in (source_dir / BEST_NAME, out_dir / SOURCE_NAME):  # read to learn their step
        if path.is_file() and ckpt.load(path).get("step") == step:
            return path
    found = _stored_copy(storage, step, out_dir) if storage else None
    if found is None:
        where = f"{source_dir}" + (f" or {storage['url']}" if storage else "")
        raise NoCheckpoint(f"no checkpoint of step {step} in {where} (pruned, or the run's node is gone)")
    return found


def evaluate_arm(
    spec: ArmSpec,
    out_dir: Path,
    device: str = "cpu",
    should_stop: Callable[[], bool] | None = None,
    lpips_weights: Path | None = None,
    *,
    evaluation: dict[str, Any],
    data_store: dict[str, Any] | None = None,
    compile_cache: dict[str, Any] | None = None,
) -> Iterator[dict[str, Any]]:
    """One record: the evaluation metrics of checkpoint `evaluation["step"]` on `evaluation["images"]`
    held-out images (train_arm's signature, so the actor runs it in train_arm's place). With
    `evaluation["batch"]` (several runs of one evaluation on this GPU, one start): one record per run in turn,
    each naming its `run_id`; a run whose checkpoint or evaluation fails yields a record with its
    `evaluation_error` instead, and the next run is evaluated."""
    shared: dict[str, Any] = {}  # metric parts reused across a batch's runs: the LPIPS network, the datasets
    if not evaluation.get("batch"):
        yield evaluate_one(spec, Path(out_dir), device, lpips_weights, evaluation, data_store, compile_cache, shared)
        return
    for item in evaluation["batch"]:
        if should_stop is not None and should_stop():
            return
        asked = {**evaluation, **{k: v for k, v in item.items() if k not in ("spec", "run_id")}, "batch": None}
        run_id = int(item["run_id"])
        try:
            record = evaluate_one(ArmSpec.model_validate(item["spec"]), Path(out_dir) / str(run_id), device,
                                  lpips_weights, asked, data_store, compile_cache, shared)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - this run's failure, named on its own record; the next runs go on
            record = {"step": int(item["step"]), EVALUATION_ERROR: describe_error(exc)[:4000]}
        yield {**record, "run_id": run_id}


def evaluate_one(spec: ArmSpec, out_dir: Path, device: str, lpips_weights: Path | None, evaluation: dict[str, Any],
                 data_store: dict[str, Any] | None, compile_cache: dict[str, Any] | None,
                 shared: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """One run's checkpoint evaluated (evaluate_arm's record), with the parts in `shared` reused."""
    out_dir.mkdir(parents=True, exist_ok=True)
    step, images = int(evaluation["step"]), int(evaluation["images"])
    t0 = time.perf_counter()
    path = find_checkpoint(Path(evaluation["source_dir"]), step, evaluation.get("storage"), out_dir)
    state = ckpt.load(path, map_location="cpu")
    if path.name == SOURCE_NAME:  # a copy from storage, as large as the checkpoint: read, not kept
        path.unlink(missing_ok=True)
    spec = with_images(spec, images)
    dev = torch.device(device)
    pin = (state.get("record") or {}).get("data_manifest_sha256")  # the prepared data the run trained on
    fetched = None
    if spec.data.url is not None:
        from worker.data_fetch import DataStore, fetch_prepared

        fetched = fetch_prepared(spec.data.url, DataStore.from_dict(data_store), pin=pin)
    parts = build(
        spec, dev, lpips_weights, fp8_linears=state.get("fp8_linears"), micro_batch=state.get("micro_batch"),
        data_root=Path(fetched.path) if fetched is not None else None, data_pin=pin, shared=shared,
    )  # fmt: skip
    restore_parts(parts, state, {})
    use_ema = spec.eval.use_ema and "model" in parts.emas
    metrics = score(parts, spec, evaluation.get("measures"))
    samples, asked = evaluation.get("samples"), evaluation.get("metrics")
    if samples and asked:  # the node's reference cache lies beside its compile cache, as training's does
        node_dir = Path(compile_cache["dir"]).parent if compile_cache else out_dir
        dist = DistributionPass(spec, dev, node_dir, evaluation.get("storage"), samples=samples, metrics=asked,
                                final=True, pins=evaluation.get("reference_pins"))  # fmt: skip
        metrics |= dist.measure(
            parts.emas["model"].module if use_ema else parts.model,
            parts.emas["text_encoder"].module if use_ema and "text_encoder" in parts.emas else parts.text_encoder,
            parts.flow, parts.dataset, parts.autocast,
        )  # fmt: skip
        metrics["fallbacks"] = dist.fallbacks()  # a stand-in extractor and why, as on a training record
        metrics["distribution_generated"] = samples  # not `_samples`: that suffix is a per-sample list
    return {
        "step": step,
        **metrics,
        "eval_weights": "ema" if use_ema else "live",
        "wall_time_s": time.perf_counter() - t0,  # what the job took on its GPU: the evaluation's cost
        "evaluated_images": images,
        "evaluated_from": str(path),  # the run's file, or the copy from storage (read, then removed)
    }


def with_images(spec: ArmSpec, images: int) -> ArmSpec:
    """`spec` evaluating its first `images` held-out images."""
    return spec.model_copy(update={"eval": spec.eval.model_copy(update={"num_samples": images})})


def score(parts: Parts, spec: ArmSpec, measures: list[str] | None) -> dict[str, Any]:
    """The per-image metrics `measures` (None: every one; without an LPIPS metric, the flow loss alone) of the
    loaded `parts` on spec.eval.num_samples held-out images: an evaluation job's scoring, and a training job's
    at its end (evaluate_in_training)."""
    use_ema = spec.eval.use_ema and "model" in parts.emas
    measures = measures or list(LPIPS_KEYS) + ["val_flow_loss"]
    return evaluate(
        parts.emas["model"].module if use_ema else parts.model,
        parts.emas["text_encoder"].module if use_ema and "text_encoder" in parts.emas else parts.text_encoder,
        parts.flow, parts.dataset, spec.eval, parts.lpips, parts.device,
        batch_size=EVAL_BATCH, autocast=parts.autocast, lpips=bool(set(measures) & set(LPIPS_KEYS)),
    )  # fmt: skip


def evaluate_in_training(parts: Parts, record: dict[str, Any], asked: dict[str, Any]) -> dict[str, Any]:
    """A training job's last checkpoint (`record`, just saved) evaluated as an evaluation job would evaluate it
    (`score`, the same record's fields), with the model still loaded: no second start (issue 62). `asked`:
    worker/protocol.py EndEvaluation. Returns {IN_TRAINING_RECORD: the job's record}, or, where it failed,
    {IN_TRAINING_ERROR: why}: the controller then leaves the run to an evaluation job."""
    t0 = time.perf_counter()
    try:
        images = int(asked["images"])
        metrics = score(parts, with_images(parts.spec, images), asked.get("measures"))
        use_ema = parts.spec.eval.use_ema and "model" in parts.emas
        return {IN_TRAINING_RECORD: {
            "step": record["step"], **metrics, "eval_weights": "ema" if use_ema else "live",
            "wall_time_s": time.perf_counter() - t0, "evaluated_images": images,
            "evaluated_from": str(record.get("checkpoint")),
        }}  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - the run's training stands; its evaluation falls back to a job
        return {IN_TRAINING_ERROR: describe_error(exc)[:4000]}
