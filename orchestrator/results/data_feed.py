"""How well a run's data kept its GPU fed, from its checkpoint records (worker/train_record.py writes them):
the share of time the loop waited for a batch, the micro-batch and gradient accumulation it trains
with, the loader's worker count, and the training images that failed to decode.

A pure function over (step, Metric.extra) records, like samples.sample_index, so the dashboard, the
API and a report read one verdict and one fix text.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from orchestrator.results.record_lists import stored_list

# Above this share of its wall time waiting for batches an arm is flagged: the study's folder of JPEGs
# decoded on the training thread waited ~70% (0.31x of the procedural set's speed, docs/benchmarks.md),
# the loader with worker processes or prepared shards stays under 5% (docs/benchmarks.md).
DATA_WAIT_LIMIT = 0.10
DATA_WAIT_FIX = (
    "prepare the folder with `ablate data prepare` and train from `data.dataset: prepared`, "
    "or give the loader more workers: data.loader_workers"
)


class DataFeed(BaseModel):
    """One run's data feeding, as of its newest checkpoint (all None before the first)."""

    wait_fraction: float | None = None  # the newest checkpoint's data_wait_fraction, 0..1
    micro_batch: int | None = None
    grad_accum: int | None = None  # micro-batches per optimizer step: batch_size = micro_batch x grad_accum
    loader_workers: int | None = None
    skipped_images: int = 0  # distinct training files that failed to decode, over the run's segments
    skipped_files: list[str] = []  # the first ten of them
    waiting: bool = False  # wait_fraction above DATA_WAIT_LIMIT
    fix: str | None = None  # what to do about it, in words, when waiting


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def data_feed(records: list[tuple[int, dict[str, Any] | None]]) -> DataFeed:
    """The DataFeed of a run from its (step, Metric.extra) records, in step order.

    Skipped images: a worker counts distinct unreadable files over the whole run, its resumes included
    (model/data/unreadable.py; the checkpoint carries the list), so the newest record's count is the
    run's. Records written before that restarted the count at each resume: the union of the files the
    records name (each names its first ten) and the largest count keep those right too.
    """
    if not records:
        return DataFeed()
    newest = records[-1][1] or {}
    most = 0
    files: dict[str, None] = {}  # an insertion-ordered set
    for _, extra in records:
        most = max(most, _int((extra or {}).get("skipped_images")) or 0)
        files.update(dict.fromkeys(stored_list(extra, "skipped_files") or []))  # a list of names, else none
    wait = newest.get("data_wait_fraction")
    wait = float(wait) if isinstance(wait, int | float) and not isinstance(wait, bool) else None
    waiting = wait is not None and wait > DATA_WAIT_LIMIT
    return DataFeed(
        wait_fraction=wait,
        micro_batch=_int(newest.get("micro_batch")),
        grad_accum=_int(newest.get("grad_accum")),
        loader_workers=_int(newest.get("loader_workers")),
        skipped_images=max(most, len(files)),
        skipped_files=list(files)[:10],
        waiting=waiting,
        fix=DATA_WAIT_FIX if waiting else None,
    )
