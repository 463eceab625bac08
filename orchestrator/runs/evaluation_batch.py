"""Evaluation jobs batched: the jobs of one evaluation that land on the same node run as one worker on one
GPU, which loads each run's checkpoint in turn and reuses the metric parts it built (the LPIPS network, the
dataset; worker/evaluation.py `evaluate_arm` with EvaluationArgs.batch), so the evaluation pays one start per
node, not one per run (on a short run the start is most of a job's cost: docs/benchmarks.md, issue 62).

Each run is still its own job (`EvaluationResult`): placed by the same trust rule (runs/trust.py
evaluator_refused: a job joins a batch only on its run's own node or a trusted one), its record checked and
stored on its own (runs/evaluation_jobs.py), and a run whose checkpoint cannot be evaluated fails its job
alone while the batch's other runs are scored. The worker is named after its first job
(`ablate-eval-<job>-<attempt>`), and each batched job keeps that name in its `extra` (BATCH_KEY) while it
runs, so a restarted controller adopts the whole batch with the worker.

A job with distribution metrics asked (samples generated per run) runs alone, as before.
"""

from __future__ import annotations

from orchestrator.db.models import EvaluationResult
from orchestrator.runs.evaluation_record import JOB_GPUS, distribution_asked
from orchestrator.runs.placement import choose_node, run_dir
from orchestrator.runs.storage import worker_storage
from orchestrator.runs.trust import evaluation_nodes, evaluator_refused
from orchestrator.settings import Settings
from worker.protocol import MAX_BATCH, BatchedRun
from worker.run_files import RECORDS_PER_POLL

BATCH_KEY = "batch_worker"  # a batched job's `extra` while it runs: the worker that scores it
WORKER_KEY = "worker"  # a stored job's `extra`: the worker that scored it (one name for a batch's jobs)
BATCH_RUNS = min(MAX_BATCH, RECORDS_PER_POLL)  # a worker's records all come back in one poll


def batchable(job: EvaluationResult) -> bool:
    """A job that may share a worker: one asking no distribution metrics."""
    return not distribution_asked(job)


class Batches:
    """One launcher pass's placement of queued jobs: each job on the node it would land on alone (its run's
    own node where a GPU is free there, else a node its values may come from), joining the batch its
    evaluation already has there (no GPU more), or starting one (a GPU)."""

    def __init__(self, free: dict[str, int], trusted: set[str]) -> None:
        self.free, self.trusted = free, trusted
        self.batches: list[tuple[str, list[EvaluationResult]]] = []  # (node, its jobs), in placement order
        self.open: dict[tuple[int, str], list[EvaluationResult]] = {}  # (evaluation, node) -> a batch to join

    def _joinable(self, job: EvaluationResult, node: str) -> bool:
        jobs = self.open.get((job.evaluation_id, node))
        return (batchable(job) and jobs is not None and len(jobs) < BATCH_RUNS
                and evaluator_refused(job.run, node, self.trusted) is None)  # fmt: skip

    def place(self, job: EvaluationResult) -> str | None:
        """The node `job` is placed on (a batch joined or started), or None: no GPU it may use is free."""
        home = job.run.node
        if home is not None and self._joinable(job, home):
            return self._add(job, home, new=False)
        allowed = evaluation_nodes(job.run, self.free, self.trusted)
        if home is not None and allowed.get(home, 0) >= JOB_GPUS:
            return self._add(job, home, new=True)
        joined = next((n for (e, n) in self.open if e == job.evaluation_id and self._joinable(job, n)), None)
        if joined is not None:
            return self._add(job, joined, new=False)
        node = choose_node(allowed, JOB_GPUS)
        return self._add(job, node, new=True) if node is not None else None

    def _add(self, job: EvaluationResult, node: str, new: bool) -> str:
        if not new:
            self.open[(job.evaluation_id, node)].append(job)
            return node
        self.free[node] -= JOB_GPUS
        jobs = [job]
        self.batches.append((node, jobs))
        if batchable(job):
            self.open[(job.evaluation_id, node)] = jobs
        return node


def batched_run(settings: Settings, job: EvaluationResult) -> BatchedRun:
    """One job as its batch's worker reads it; ValueError where its run's stored spec no longer validates."""
    run = job.run
    source = run.checkpoint_dir or str(run_dir(settings, run.id))
    storage = worker_storage(settings, run.checkpoint_url) if run.checkpoint_url else None
    return BatchedRun.model_validate({"run_id": run.id, "spec": {**run.spec, "gpus": JOB_GPUS}, "step": job.step,
                                      "source_dir": source, "storage": storage})  # fmt: skip


def batch_members(jobs: list[EvaluationResult], name: str) -> None:
    """Record on each of a batch's jobs the worker that scores it (BATCH_KEY), for adoption after a restart."""
    for job in jobs:
        job.extra = {**(job.extra or {}), BATCH_KEY: name}
