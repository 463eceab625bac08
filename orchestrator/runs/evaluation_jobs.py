"""Evaluation jobs on nodes: each run's stored checkpoint evaluated again on more held-out images.

An evaluation (orchestrator/grids/evaluations.py) is one job per run (an `EvaluationResult` row), and a
job is a run-like worker: the launcher places it on a node with a free GPU whose values may stand for the
run's (runs/trust.py evaluator_refused: the run's own node, first, where its checkpoints are on disk, or a
trusted one; only a trusted one for the control of a grid with control_on_trusted; a job waits for one,
saying so), through the same node pool, agent and `start` op as a run, with
`WorkerArgs.evaluation` set; the worker (worker/evaluation.py) yields one record, the checkpoint's
metrics on the asked images, and trains nothing. The jobs of one evaluation that land on one node share
one worker (runs/evaluation_batch.py: one start, each run's checkpoint in turn, one record per run naming
its run_id, handled per job here). States: queued -> running -> completed | failed.

- Placement is on record (the job's `node` and `attempt`, committed) before the node is asked, so a
  node's hello that names an evaluation worker is checked like a run's (`not_placed`).
- Resumable: a restarted controller adopts a job's live worker by name (`ablate-eval-<job>-<attempt>`)
  or, once every node has answered, queues the job again with attempt + 1.
- Refusable: a node that refuses the start, a worker that fails, or a reply the protocol, the metric
  ranges or runs/evaluation_record.py refuse (another step, other than the images asked for) fails the job
  with the reason; a lost worker is queued again up to max_retries.
- Its cost is the node's wall time bounded by the controller's: from the placement (`started_at`) to the
  record.
- Stored beside the training records (the job's own row), never over the run's Metric rows or its step.

Nothing here imports Ray: replies are validated JSON.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session

from model.spec import ArmSpec
from orchestrator.db.models import Evaluation, EvaluationResult, utcnow
from orchestrator.db.session import session_scope
from orchestrator.fleet.node_pool import NodePool
from orchestrator.grids.evaluations import flow_only, measured_by
from orchestrator.numbers import json_safe
from orchestrator.runs.evaluation_batch import BATCH_KEY, WORKER_KEY, Batches, batch_members, batched_run
from orchestrator.runs.evaluation_record import (
    ASKED,
    CLAIMED_KEY,
    JOB_GPUS,
    SEEN_KEY,
    bounded_wall_time,
    distribution_asked,
    diverged_skip,
    refused_evaluation,
    seen_seconds,
)
from orchestrator.runs.ingest import metric_values, refused_metrics
from orchestrator.runs.placement import choose_node, not_placed, run_dir
from orchestrator.runs.reference_pins import pins_for, refused_references
from orchestrator.runs.storage import worker_data_store, worker_storage
from orchestrator.runs.trust import evaluator_refused, trusted_nodes
from orchestrator.settings import Settings
from orchestrator.vocabulary import EvaluationState
from worker.protocol import (
    EVALUATION_ERROR,
    CheckpointRecord,
    EvaluationArgs,
    WorkerArgs,
    WorkerLost,
    WorkerReply,
    refused_records,
)
from worker.worker_names import evaluation_worker_name, parse_evaluation_name

log = logging.getLogger("ablate.evaluations")

EVALUATE_FN = "worker.evaluation:evaluate_arm"
# Why nothing starts on a machine without GPUs: the launcher's log and every waiting evaluation say it.
NO_GPUS = "no node has GPUs; set ABLATE_LOGICAL_GPUS=N to declare N logical ones on this machine"


@dataclass
class JobWorker:
    """A live evaluation worker of ours (on `node`, through its agent)."""

    job_id: int
    name: str
    node: str
    started: bool = False
    launched_at: float = field(default_factory=time.monotonic)
    job_ids: list[int] = field(default_factory=list)  # every job it scores (a batch's), job_id first

    def __post_init__(self) -> None:
        self.job_ids = self.job_ids or [self.job_id]


def evaluation_dir(settings: Settings, job_id: int) -> str:
    """The job's own directory on the node (its records; a checkpoint copied from storage)."""
    return str(settings.home_dir.resolve() / "evaluations" / str(job_id))


def evaluation_args(settings: Settings, session: Session, job: EvaluationResult) -> WorkerArgs:
    """What the node's agent builds the job's worker from: the run's spec on one GPU, its checkpoint's step, and
    the reference features the controller pinned for its distribution metrics."""
    run = job.run
    source = run.checkpoint_dir or str(run_dir(settings, run.id))
    spec = ArmSpec.model_validate({**run.spec, "gpus": JOB_GPUS})
    asked = distribution_asked(job)
    return WorkerArgs(
        run_id=run.id,
        spec=spec,
        out_dir=evaluation_dir(settings, job.id),
        lpips_weights=str(settings.lpips_weights.resolve()) if settings.lpips_weights else None,
        torch_threads=settings.worker_threads,
        train_fn=EVALUATE_FN,
        data_store=worker_data_store(settings),
        evaluation=EvaluationArgs(
            step=job.step, source_dir=source, images=job.evaluation.images,
            storage=worker_storage(settings, run.checkpoint_url) if run.checkpoint_url else None,
            **asked, reference_pins=pins_for(session, spec, asked.get("metrics") or []),
            measures=list(measured) if flow_only(measured := measured_by(job.evaluation)) else None,
        ),
    )  # fmt: skip


def not_placed_workers(session: Session, node: str, names: list[str]) -> list[str]:
    """The workers among `names` that the controller did not place on `node`: a run's attempt
    (placement.not_placed), or an evaluation job's current attempt (its `node` and `attempt`)."""
    jobs = {name: parsed for name in names if (parsed := parse_evaluation_name(name)) is not None}
    refused = not_placed(session, node, [n for n in names if n not in jobs])
    for name, (job_id, attempt) in jobs.items():
        job = session.get(EvaluationResult, job_id)
        if job is None or (job.node, job.attempt) != (node, attempt):
            refused.append(name)
    return refused


def settle(evaluation: Evaluation) -> None:
    """The evaluation's state from its jobs': failed once one failed (the jobs still queued with it),
    completed once all completed or were skipped (a diverged run's: evaluation_record.diverged_skip), running
    once one was placed."""
    jobs = evaluation.results
    failed = [j for j in jobs if j.state == EvaluationState.failed]
    if failed:
        for job in jobs:
            if job.state == EvaluationState.queued:
                job.state, job.error = EvaluationState.failed, "not run: another run's job failed"
        evaluation.state = EvaluationState.failed
        first_line = ((failed[0].error or "").splitlines() or [""])[0]  # the job keeps the whole text
        evaluation.error = f"run {failed[0].run_id}: {first_line}"[:4000]
    elif all(j.state in (EvaluationState.completed, EvaluationState.skipped) for j in jobs):
        evaluation.state = EvaluationState.completed
    elif any(j.state != EvaluationState.queued for j in jobs):
        evaluation.state = EvaluationState.running
    if evaluation.state in (EvaluationState.failed, EvaluationState.completed) and evaluation.finished_at is None:
        evaluation.finished_at = utcnow()


def store_record(job: EvaluationResult, record: dict, worker: str) -> None:
    """The record as the job's result; its wall time and cost bounded by the controller's own (the claim and
    the time seen kept beside them in `extra`). `worker`: the worker that scored it (a batch's, or the run's
    training worker: runs/in_training.py)."""
    values = metric_values(record)
    claimed, seen = record.get("wall_time_s"), seen_seconds(job)
    wall = bounded_wall_time(claimed, seen)
    extra = values["extra"]
    extra.get("nonfinite", {}).pop("wall_time_s", None)  # the stored wall time is the bounded one
    if "nonfinite" in extra and not extra["nonfinite"]:
        del extra["nonfinite"]
    extra[CLAIMED_KEY], extra[SEEN_KEY] = json_safe(claimed), seen
    extra[WORKER_KEY] = worker  # one name for every job of a batch: scored with one start
    extra.pop("run_id", None)  # a batched record's: the job's own run, checked (refused_records)
    if (asked := distribution_asked(job)) and isinstance(extra, dict):
        extra[ASKED] = asked  # what the record was checked against, kept with it
    for key, value in values.items():
        setattr(job, key, value)
    job.wall_time_s, job.gpu_seconds = wall, wall * JOB_GPUS
    job.gpu_hours = job.gpu_seconds / 3600
    job.state, job.finished_at = EvaluationState.completed, utcnow()


CANCELLED = "cancelled by the user"


def cancel(evaluation: Evaluation) -> bool:
    """End an evaluation no longer wanted: its queued and running jobs fail as cancelled (a running job's
    worker is ended at the launcher's next poll, which kills a worker whose job is no longer running).
    False where it had ended already."""
    if evaluation.state in (EvaluationState.completed, EvaluationState.failed):
        return False
    for job in evaluation.results:
        if job.state in (EvaluationState.queued, EvaluationState.running):
            job.state, job.error, job.finished_at = EvaluationState.failed, CANCELLED, utcnow()
    settle(evaluation)
    evaluation.error = CANCELLED
    return True


class EvaluationJobs:
    """The launcher's evaluation workers: launch, poll replies, adopt after a restart, re-queue or fail."""

    def __init__(self, settings: Settings, pool: NodePool) -> None:
        self.settings = settings
        self.pool = pool
        self.workers: dict[int, JobWorker] = {}  # job id -> its live worker

    def gpus_held(self, node: str) -> int:
        return JOB_GPUS * sum(1 for w in self.workers.values() if w.node == node)

    def poll_groups(self, groups: dict[str, dict[str, int | None]]) -> None:
        """Add our workers to the launcher's poll (each asked for all its records: it has one)."""
        for worker in self.workers.values():
            groups.setdefault(worker.node, {})[worker.name] = None

    def by_name(self) -> dict[str, JobWorker]:
        return {w.name: w for w in self.workers.values()}

    # launch -----------------------------------------------------------------------------------------

    def launch(self, free: dict[str, int]) -> None:
        """Queued jobs in order, each on its run's node when that has a GPU free, else on another node whose
        values may stand for the run's (evaluation_nodes), the jobs of one evaluation on one node batched into
        one worker (runs/evaluation_batch.py); a job with none waits, its `error` saying why."""
        with session_scope(self.settings.database_url) as session:
            queued = session.scalars(
                select(EvaluationResult).where(EvaluationResult.state == EvaluationState.queued)
                .order_by(EvaluationResult.id)
            ).all()  # fmt: skip
            trusted = trusted_nodes(session)
            batches, held = Batches(free, trusted), []
            for job in queued:
                if batches.place(job) is not None:
                    continue
                if choose_node(free, JOB_GPUS) is None:
                    held.append(job)
                else:
                    self._wait(job, free, trusted)
            if held:
                self._hold(held)
            for node, jobs in batches.batches:
                if not self._start(session, jobs, node):
                    free[node] += JOB_GPUS

    def _hold(self, queued: list[EvaluationResult]) -> None:
        """Say on each queued job why no GPU is free for it, so `ablate evaluate` prints it at once."""
        up = self.pool.up()
        if not up:
            why = "waiting: no node is up (ablate nodes list; `ablate serve` starts this machine's)"
        elif not any(entry.gpus for entry in up.values()):
            why = f"waiting: {NO_GPUS}"
        else:
            why = "waiting for a GPU: every one is busy with runs or evaluations"
        for job in queued:
            if job.error != why:
                job.error = why

    @staticmethod
    def _wait(job: EvaluationResult, free: dict[str, int], trusted: set[str]) -> None:
        """Say on the job why the free GPUs are not its (a stranger's values would stand for the run's)."""
        elsewhere = [n for n, gpus in free.items() if gpus >= JOB_GPUS]
        why = evaluator_refused(job.run, elsewhere[0], trusted)
        job.error = f"waiting for a GPU on the run's own node or a trusted one: {why}"[:4000]

    def _start(self, session: Session, jobs: list[EvaluationResult], node: str) -> bool:
        """One worker on `node` for `jobs` (one, or a batch of one evaluation's: each run in turn, one start)."""
        lead = jobs[0]
        name = evaluation_worker_name(lead.id, lead.attempt)
        for job in jobs:
            job.state, job.node, job.started_at, job.error = EvaluationState.running, node, utcnow(), None
        if len(jobs) > 1:
            batch_members(jobs, name)
        settle(lead.evaluation)
        session.commit()  # on record before the node holds it (a restart adopts it; a hello is checked)
        try:
            args = evaluation_args(self.settings, session, lead)
        except ValueError as exc:  # a stored spec this version no longer accepts
            for job in jobs:
                self._fail(session, job, f"its run's spec cannot be evaluated: {exc}")
            return False
        if len(jobs) > 1:
            items = []
            for job in jobs:
                try:
                    items.append(batched_run(self.settings, job))
                except ValueError as exc:
                    self._fail(session, job, f"its run's spec cannot be evaluated: {exc}")
            jobs = [j for j in jobs if j.state == EvaluationState.running]
            assert args.evaluation is not None
            args.evaluation.batch = items
        if self.pool.start(node, name, args) is None:
            for job in jobs:
                self._fail(session, job, f"node {node} could not start evaluation worker {name}: "
                                         f"{self.pool.nodes[node].error}")
            return False
        self.workers[lead.id] = JobWorker(lead.id, name, node, job_ids=[j.id for j in jobs])
        log.info("evaluation jobs %s (runs %s) on node %s as %s", [j.id for j in jobs], [j.run_id for j in jobs],
                 node, name)  # fmt: skip
        return True

    # replies ----------------------------------------------------------------------------------------

    def collect(self, worker: JobWorker, reply: WorkerReply | WorkerLost) -> bool:
        """Handle one validated poll reply; True when the worker is gone (its GPU is free)."""
        try:
            return self._collect(worker, reply)
        except (OperationalError, InterfaceError):
            log.warning("database unreachable while storing evaluation job %s; retrying", worker.job_id, exc_info=True)
            return False

    def _collect(self, worker: JobWorker, reply: WorkerReply | WorkerLost) -> bool:
        worker.started = True
        batched, ended = len(worker.job_ids) > 1, isinstance(reply, WorkerLost) or reply.state in ("done", "error")
        running = False
        for job_id in worker.job_ids:
            with session_scope(self.settings.database_url) as session:  # each job's own commit (or rollback)
                job = session.get(EvaluationResult, job_id)
                if job is None or job.state != EvaluationState.running:  # deleted with its grid, or ended
                    continue
                if isinstance(reply, WorkerLost):
                    self._requeue(session, job, f"worker {worker.name} lost ({reply.error})")
                    continue
                records = [r for r in reply.records if not batched or r.run_id == job.run_id]
                if not self._job_reply(session, worker, job, records, reply, batched):
                    running = True
        if running and not ended:
            return False
        self._kill(worker)
        return True

    def _job_reply(self, session: Session, worker: JobWorker, job: EvaluationResult, sent: list[CheckpointRecord],
                   reply: WorkerReply, batched: bool) -> bool:  # fmt: skip
        """Handle one job's records of a reply; True once the job has ended (stored, skipped or failed)."""
        records = [r.values() for r in sent]
        failed = next((r[EVALUATION_ERROR] for r in records if isinstance(r.get(EVALUATION_ERROR), str)), None)
        if failed is not None:  # a batched run whose checkpoint could not be evaluated: its job alone fails
            self._fail(session, job, failed)
            return True
        refused = refused_records(sent, job.run_id, None)
        skip = next((why for r in records if (why := diverged_skip(job, r)) is not None), None)
        if refused is None and skip is not None:
            job.state, job.error, job.finished_at = EvaluationState.skipped, skip[:4000], utcnow()
            settle(job.evaluation)
            return True
        refused = refused or refused_metrics(records)
        if refused is None:
            refused = next((why for r in records if (why := refused_evaluation(job, r)) is not None), None)
        if refused is None:
            refused = refused_references(session, job.run, worker.node, records, trusted_nodes(session))
        if refused is not None:
            session.rollback()  # a refused record pins nothing
            job = session.get(EvaluationResult, job.id)
            self._fail(session, job, f"node {worker.node} sent {refused}: refused, nothing stored")
        elif records:
            store_record(job, records[-1], worker.name)
            settle(job.evaluation)
        elif reply.state == "error":
            self._fail(session, job, reply.error or "the worker failed without a message")
        elif reply.state == "done":
            self._fail(session, job, "the worker ended without a record" + (" of this run" if batched else ""))
        else:
            return False
        return True

    def _fail(self, session: Session, job: EvaluationResult, why: str) -> None:
        job.state, job.error, job.finished_at = EvaluationState.failed, why[:4000], utcnow()
        settle(job.evaluation)
        log.warning("evaluation job %s (run %s) failed: %s", job.id, job.run_id, why.splitlines()[0][:300])

    def _requeue(self, session: Session, job: EvaluationResult, why: str) -> None:
        job.attempt += 1
        if job.attempt > self.settings.max_retries:
            self._fail(session, job, f"worker lost {job.attempt} times; last: {why}")
            return
        job.state, job.node = EvaluationState.queued, None
        job.extra = {k: v for k, v in (job.extra or {}).items() if k != BATCH_KEY}
        log.info("evaluation job %s re-queued (attempt %s): %s", job.id, job.attempt, why)

    def _kill(self, worker: JobWorker) -> None:
        self.workers.pop(worker.job_id, None)
        self.pool.kill(worker.node, worker.name)

    # restart, lost nodes, unplaced workers ------------------------------------------------------------

    def reconcile(self) -> None:
        """Adopt the live workers of running jobs we do not track (a batch's jobs with its worker, by the
        name each keeps: BATCH_KEY); re-queue those on no node."""
        with session_scope(self.settings.database_url) as session:
            running = session.scalars(
                select(EvaluationResult).where(EvaluationResult.state == EvaluationState.running)
                .order_by(EvaluationResult.id)
            ).all()  # fmt: skip
            tracked = {i for w in self.workers.values() for i in w.job_ids}
            by_name: dict[str, list[EvaluationResult]] = {}
            for job in running:
                if job.id not in tracked:
                    name = (job.extra or {}).get(BATCH_KEY) or evaluation_worker_name(job.id, job.attempt)
                    by_name.setdefault(name, []).append(job)
            for name, jobs in by_name.items():
                node = self.pool.find(name)
                parsed = parse_evaluation_name(name)
                if node is not None and parsed is not None:
                    self.workers[parsed[0]] = JobWorker(parsed[0], name, node, job_ids=[j.id for j in jobs])
                    log.info("adopted evaluation worker %s on node %s", name, node)
                elif self.pool.all_heard():
                    for job in jobs:
                        self._requeue(session, job, f"worker {name} not found on any node after a controller restart")

    def lose_node(self, node: str, why: str) -> None:
        for worker in [w for w in self.workers.values() if w.node == node]:
            self.collect(worker, WorkerLost(state="lost", error=why))

    def expire_unplaced(self, now: float) -> None:
        """A worker Ray has not placed within start_timeout_s counts as lost."""
        limit = self.settings.start_timeout_s
        for worker in [w for w in self.workers.values() if not w.started and now - w.launched_at > limit]:
            self.collect(worker, WorkerLost(state="lost", error=f"not started within start_timeout_s={limit:g} s"))

