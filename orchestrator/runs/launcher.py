"""The controller loop: queued runs -> one worker per run on one GPU of a node -> metric records -> DB -> detector.

State machine per run: queued -> starting -> running -> completed | stopped | failed.
- Nodes (orchestrator/fleet/node_pool.py): the controller's own machine and every joined node, each with
  its own Ray, reached through its agent (worker/agent.py) over its SSH connection or pipes, in JSON.
- Launch: queued runs FIFO within a grid, grids in submission order, each on the node with the most GPUs
  that none of our workers hold, if it has as many as the arm asks for (`gpus`: all of one node's); an
  auto grid's runs when, where and as wide as its night plan, redrawn each pass, says (runs/replan.py). Each
  run is a named, detached actor of the node's Ray (`ablate-run-<id>-<attempt>` in the settings'
  namespace) with the arm's GPUs (Ray sets CUDA_VISIBLE_DEVICES) and num_cpus=0.
- Ingest (orchestrator/runs/ingest.py): every record the worker yields is stored idempotently on
  (run_id, step); the detector judges every new checkpoint, and collapse | diverged | stalled stops
  the run gracefully.
- Worker death: the run is re-queued (retries + 1) and resumes from its last checkpoint; past
  max_retries it fails with the error. A run being stopped (user or detector) is finished as stopped.
- Growth (runs/grow.py): GPUs left free go to a running auto arm when that shortens its grid's night; its
  worker stops at its next step and the run resumes first, on the same node, on more GPUs.
  A worker that Ray cannot place within start_timeout_s is killed and counts as died.
- Restart: a new controller asks every node's agent for its workers by name and polls each for the
  records after the last step in the DB; a run whose worker is on no node is re-queued (a retry counted).
- Node loss: a node unreachable for node_lost_s, or one whose agent sent what the protocol refuses, loses
  its workers: their runs are re-queued like a dead worker's, with the reason.
- Listeners (orchestrator/loop.py wires them for the server and the demo): after each stored reply the
  run id is handed to the tracker forwarder (orchestrator/trackers/), whose threads send what is new to
  W&B, TensorBoard or MLflow, so the loop never waits for a tracker; every housekeeping pass lets the
  report writer write the reports of grids that ended.
- Races with the API: queued -> starting and queued -> stopped are compare-and-set updates, so a
  user's stop and a launch never both win.
- Evaluation jobs (runs/evaluation_jobs.py: checkpoints evaluated again) take the GPUs runs leave free.

Nothing here imports Ray or unpickles anything a node sends: replies are validated JSON.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from sqlalchemy import select
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session

from model.spec import COMMAND_ENDS
from orchestrator.db.events import record_event
from orchestrator.db.models import Grid, Run, utcnow
from orchestrator.db.session import session_scope
from orchestrator.db.transitions import transition
from orchestrator.fleet.node_pool import NodePool
from orchestrator.messages import strip_ansi
from orchestrator.runs.command_code import CodeRefused, ship_code
from orchestrator.runs.evaluation_jobs import NO_GPUS, EvaluationJobs, not_placed_workers
from orchestrator.runs.grow import Grower
from orchestrator.runs.in_training_store import stored_in_training
from orchestrator.runs.ingest import ingest, last_step, refused_metrics
from orchestrator.runs.placement import (
    Worker,
    arm_gpus,
    claim_for_launch,
    mark_running,
    nonempty,
    record_placement,
    run_dir,
    worker_args,
)
from orchestrator.runs.reference_pins import checked_references
from orchestrator.runs.replan import Held, Replanner
from orchestrator.runs.run_end import finish_run, requeue_run
from orchestrator.runs.storage import record_storage, run_storage_url, seen_seq
from orchestrator.runs.trust import trusted_only
from orchestrator.settings import Settings
from orchestrator.vocabulary import ACTIVE_STATES, TERMINAL_STATES, GridSource, RunState
from worker.protocol import WorkerLost, WorkerReply, refused_records
from worker.worker_names import worker_name

log = logging.getLogger("ablate.launcher")

# A worker whose replies fail to store this many times in a row for a reason other than the database
# being unreachable (a record the DB refuses) has its run failed with the error, so it cannot stall
# the loop; an unreachable database is waited out.
MAX_INGEST_FAILURES = 5


class LoopListener(Protocol):
    """What follows the loop without slowing it: told of each run a reply was stored for, and of every
    housekeeping pass. The server and the demo hand in the tracker forwarder (orchestrator/trackers/) and
    the report writer (orchestrator/results/reports/write.py), so the live loop imports neither."""

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def notify(self, run_id: int) -> None: ...
    def housekeeping(self) -> None: ...


# -- the loop -----------------------------------------------------------------------------------------


class Launcher:
    """Launch, poll, ingest, stop, retry. `start()` runs it in a daemon thread; `tick()` is one pass."""

    def __init__(
        self,
        settings: Settings,
        train_fn: str = "worker.train:train_arm",
        local_agent: list[str] | None = None,
        listeners: Sequence[LoopListener] = (),
        replanner: Replanner | None = None,
    ) -> None:
        self.settings = settings
        self.train_fn = train_fn  # what the workers run; benchmarks pass a synthetic stream
        self.pool = NodePool(settings, local_agent, self._not_placed)  # local_agent: tests put a hostile agent there
        self.workers: dict[int, Worker] = {}
        self.evaluations = EvaluationJobs(settings, self.pool)  # evaluation jobs' workers, beside the runs'
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_housekeeping = 0.0
        self._warned_no_gpu = False
        self.listeners = tuple(listeners)  # trackers and reports: each in threads or passes of its own
        self.replanner = replanner or Replanner()  # the auto grids' night plans, redrawn each launch pass
        self.grower = Grower(settings, self.pool.placeable, self.replanner.now)  # running arms onto freed GPUs

    # lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> None:
        """Return at once: the nodes' agents start in the background, so an API beside it serves now."""
        self._thread = threading.Thread(target=self.run_forever, name="ablate-launcher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the loop and close the node links; detached workers keep training for the next controller
        (a local node's Ray of its own ends with its agent). False when the thread did not end in time."""
        self._halt.set()
        if self._thread is None:
            self.pool.close()
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def run_forever(self) -> None:
        for listener in self.listeners:
            listener.start()
        try:
            while not self._halt.is_set():
                try:
                    self.tick()
                except Exception:  # a DB hiccup must not kill the controller; the next tick retries
                    log.exception("launcher tick failed")
                    self._halt.wait(self.settings.launcher_interval_s)
        finally:
            for listener in self.listeners:
                listener.stop()
            self.pool.close()

    def tick(self) -> None:
        """One pass: nodes, reconcile, collect worker replies (waiting up to the interval), stop, launch.

        Reconciling runs on every pass (not once per process): a run whose worker was dropped while
        its DB write failed (the DB restarting) is found again here, so no run stays `running` without
        a live worker of ours.
        """
        # Nodes that left (drained, torn down, removed, refused), then those down past node_lost_s.
        for node, why in [*self.pool.refresh().items(), *self.pool.lost().items()]:
            self._lose_node(node, why)
        self.reconcile()
        groups: dict[str, dict[str, int | None]] = {}
        for worker in self.workers.values():
            groups.setdefault(worker.node, {})[worker.name] = worker.after_step
        self.evaluations.poll_groups(groups)
        replies = self.pool.poll(groups, self.settings.launcher_interval_s) if groups else {}
        if not replies:  # nothing polled (no workers, or their nodes are down): the agents did not wait
            self._halt.wait(self.settings.launcher_interval_s)
        freed = False
        by_name, jobs = {w.name: w for w in self.workers.values()}, self.evaluations.by_name()
        for answers in replies.values():
            for name, reply in answers.items():
                if name in by_name:
                    freed |= self._collect_isolated(by_name[name], reply)
                elif name in jobs:
                    freed |= self.evaluations.collect(jobs[name], reply)
        now = time.monotonic()
        if freed or now - self._last_housekeeping >= self.settings.launcher_interval_s:
            self._last_housekeeping = now
            self._expire_unplaced(now)
            self.evaluations.expire_unplaced(now)
            self._send_stops()
            self._launch_queued()
            self.grower.offer(self.workers, self.free_gpus(), self._request_stop)
            self.evaluations.launch(self.free_gpus())  # the GPUs queued runs and growths left free
            for listener in self.listeners:
                listener.housekeeping()  # the report writer: grids that ended since the last pass

    def _lose_node(self, node: str, why: str) -> None:
        for worker in [w for w in self.workers.values() if w.node == node]:
            self._worker_died(worker, RuntimeError(why))
        self.evaluations.lose_node(node, why)

    # reconcile ---------------------------------------------------------------------------------------

    def reconcile(self) -> None:
        """Make the tracked workers agree with the DB: adopt the live workers of active runs we do not
        track, re-queue active runs whose worker is gone, and drop workers whose run has finished."""
        with session_scope(self.settings.database_url) as session:
            runs = session.scalars(select(Run).where(Run.state.in_(ACTIVE_STATES))).all()
            active = {run.id for run in runs}
            tracked = [w for w in self.workers.values() if w.run_id not in active]
            if tracked:
                finished = session.scalars(
                    select(Run.id).where(Run.id.in_([w.run_id for w in tracked]), Run.state.in_(TERMINAL_STATES))
                ).all()
                for worker in tracked:
                    if worker.run_id in finished:
                        log.info("run %s is final in the DB; dropping its worker %s", worker.run_id, worker.name)
                        self._kill(worker)
            for run in runs:
                if run.id in self.workers:
                    continue
                name = worker_name(run.id, run.retries)
                node = self.pool.find(name)
                if node is not None:
                    self.workers[run.id] = Worker(
                        run.id, name, node, last_step(session, run.id), attempt=run.retries,
                        storage_seen=seen_seq(session, run.id, run.retries), gpus=arm_gpus(run.spec),
                    )
                    log.info("adopted worker %s of run %s on node %s", name, run.id, node)
                    continue
                if self.pool.all_heard():  # else its node may still answer: wait
                    requeue_run(session, run, f"worker {name} not found on any node after a controller restart",
                                self.settings.max_retries)
        self.evaluations.reconcile()

    def _not_placed(self, node: str, names: list[str]) -> list[str]:
        """The workers a node's hello names that the controller never placed there (the pool refuses them)."""
        with session_scope(self.settings.database_url) as session:
            return not_placed_workers(session, node, names)

    # launch ------------------------------------------------------------------------------------------

    def free_gpus(self) -> dict[str, int]:
        """Per reachable node, the GPUs none of our workers hold (its Ray queues a worker whose GPU is
        still freeing)."""
        free = {}
        for name, entry in self.pool.placeable().items():
            held = sum(w.gpus for w in self.workers.values() if w.node == name) + self.evaluations.gpus_held(name)
            free[name] = entry.gpus - held
        if self.pool.up() and not any(e.gpus for e in self.pool.up().values()) and not self._warned_no_gpu:
            self._warned_no_gpu = True
            log.warning(NO_GPUS)
        return free

    def _launch_queued(self) -> None:
        free = self.free_gpus()
        with session_scope(self.settings.database_url) as session:
            queued = self.grower.first(session.scalars(  # grown runs first: on the GPUs they freed
                select(Run)
                .join(Grid)
                .where(Run.state == RunState.queued, Grid.source != GridSource.imported)
                .order_by(Grid.created_at, Grid.id, Run.position, Run.id)
            ).all())
            # The auto grids' plans, redrawn from now: their runs start when and as their slot says.
            plans = self.replanner.redraw(session, queued, {n: e.gpus for n, e in self.pool.placeable().items()},
                                          {w.run_id: Held(w.node, w.gpus) for w in self.workers.values()})
            for run in queued:
                if run.being_stopped:  # e.g. re-queued after its worker died while stopping
                    self._finish_queued_stop(session, run)
                    continue
                node = self.grower.node_for(run, free) or plans.node_for(run, trusted_only(session, run, free))
                if node is None:
                    continue  # held back by its plan, or later runs may still fit, or be stops to finish
                need = arm_gpus(run.spec)
                if self._launch(session, run, node):
                    free[node] -= need

    def _finish_queued_stop(self, session: Session, run: Run) -> None:
        why = run.stop_reason("stopped by the user before it started")
        if transition(session, run, RunState.queued, state=RunState.stopped, finished_at=utcnow()):
            record_event(session, run, "stopped", why, step=run.last_checkpoint_step, decision=run.decision)
            log.info("run %s stopped: %s", run.id, why)

    def _launch(self, session: Session, run: Run, node: str) -> bool:
        """Claim the queued run and start its worker on `node`; False (nothing started) when a stop won the
        race. A node that fails the start loses the run back to the queue (a retry counted)."""
        name = worker_name(run.id, run.retries)
        out_dir = run_dir(self.settings, run.id)
        # Claim first: on Postgres the row stays locked until commit, so a concurrent stop waits and
        # then sees `starting` (and sets stop_requested); one that committed first makes this fail.
        if not claim_for_launch(session, run, str(out_dir)):
            log.info("run %s left the queue (%s) before its launch; not launched", run.id, run.state)
            return False
        found = self.pool.find(name)  # left by a controller that died between creating it and committing
        if found is None and run.retries == 0 and run.last_checkpoint_step is None and nonempty(out_dir):
            # Files from another database's run with the same id: resuming from them would be wrong.
            aside = out_dir.with_name(f"{out_dir.name}.stale-{int(time.time())}")
            out_dir.rename(aside)
            record_event(session, run, "stale_dir", f"moved an unrelated {out_dir} aside to {aside}", path=str(aside))
        # Durable storage: the same prefix for every attempt, so a new node resumes from it.
        run.checkpoint_url = run_storage_url(self.settings, run)
        node = found or node
        if found is None:
            # On record before the node holds the worker: a controller that dies after the start finds
            # it placed there, and a node that names a worker it was not given is refused.
            record_placement(session, run, node, name)
            session.commit()
            try:  # a command arm's code goes to a joined node first
                code_archive = ship_code(self.settings, self.pool, node, run.spec)
            except CodeRefused as exc:  # no retry can fix it: too large, or outside the allowed directories
                run.error = str(exc)
                finish_run(session, run, RunState.failed, run.error)
                return False
            except Exception as exc:  # noqa: BLE001 - the node's link: retried like a failed start
                requeue_run(session, run, f"node {node}: copying the code failed: {type(exc).__name__}: {exc}",
                            self.settings.max_retries)
                return False
            args = worker_args(self.settings, run, out_dir, self.train_fn, code_archive)
            if self.pool.start(node, name, args) is None:
                requeue_run(session, run, f"node {node} could not start worker {name}: {self.pool.nodes[node].error}",
                            self.settings.max_retries)
                return False
        after = last_step(session, run.id)
        self.workers[run.id] = Worker(
            run.id, name, node, after, attempt=run.retries, storage_seen=seen_seq(session, run.id, run.retries),
            gpus=arm_gpus(run.spec),
        )
        if run.last_checkpoint_step is not None:
            record_event(session, run, "resumed", f"attempt {run.retries} resumes from step {run.last_checkpoint_step}",
                         step=run.last_checkpoint_step, attempt=run.retries)
        log.info("launched run %s (%s) as %s on node %s", run.id, run.arm, name, node)
        return True

    # poll and collect --------------------------------------------------------------------------------

    def _collect_isolated(self, worker: Worker, reply: WorkerReply | WorkerLost) -> bool:
        """`_collect`, with a failure confined to this worker: the other workers, stops and launches of
        the pass go on. An unreachable DB is retried; any other error, MAX_INGEST_FAILURES times in a
        row, fails the run with it (its records stay in the worker's records.jsonl)."""
        try:
            gone = self._collect(worker, reply)
        except (OperationalError, InterfaceError):
            log.warning("database unreachable while storing run %s's reply; retrying", worker.run_id, exc_info=True)
            return False
        except Exception as exc:
            worker.ingest_failures += 1
            log.exception("storing run %s's reply failed (%d in a row)", worker.run_id, worker.ingest_failures)
            if worker.ingest_failures < MAX_INGEST_FAILURES:
                return False
            self._fail_worker(worker, f"its records could not be stored {worker.ingest_failures} times: "
                              f"{type(exc).__name__}: {exc}")
            return True
        worker.ingest_failures = 0
        return gone

    def _fail_worker(self, worker: Worker, message: str) -> None:
        """End the worker and fail its run with `message` (its records so far stay stored)."""
        self._kill(worker)
        with session_scope(self.settings.database_url) as session:
            run = session.get(Run, worker.run_id)
            if run is not None and run.state in ACTIVE_STATES:
                run.error = message[:4000]
                finish_run(session, run, RunState.failed, message.splitlines()[0][:500])

    def _collect(self, worker: Worker, reply: WorkerReply | WorkerLost) -> bool:
        """Handle one validated poll reply; True when the worker is gone (its GPU is free)."""
        if isinstance(reply, WorkerLost):
            self._worker_died(worker, RuntimeError(reply.error))
            return True
        records = [record.values() for record in reply.records]
        refused = refused_records(reply.records, worker.run_id, worker.after_step) or refused_metrics(records)
        refused = refused or checked_references(self.settings.database_url, worker.run_id, worker.node, records)
        if refused is not None:
            self._fail_worker(worker, f"node {worker.node} sent {refused}: refused, nothing of the reply stored")
            return True
        gone = True
        with session_scope(self.settings.database_url) as session:
            run = session.get(Run, worker.run_id)
            if run is None:  # grid deleted under us
                self._kill(worker)
                return True
            if not worker.started and reply.state != "error":  # a worker that failed never started
                mark_running(session, run, reply.info.model_dump(), worker.node)
            if records:
                stored_in_training(session, run, records, ingest(session, run, records))  # runs/in_training.py
            seen = record_storage(session, run, worker.attempt, reply.storage, worker.storage_seen)
            if run.being_stopped:
                self._request_stop(worker)
            # A command arm's end (stop file, SIGTERM, SIGKILL) is said in the final event and kept in its data.
            ended = {"ended_by": reply.ended_by} if reply.ended_by else {}
            how = f"; {COMMAND_ENDS[reply.ended_by]}" if reply.ended_by else ""
            if reply.state == "done" and reply.stopping and (growth := self.grower.asked(session, run)):
                self.grower.ended(session, run, worker.node, growth)  # back in the queue on more GPUs
            elif reply.state == "done":
                if run.being_stopped or reply.stopping:
                    finish_run(session, run, RunState.stopped, run.stop_reason() + how, **ended)
                else:
                    message = f"finished at step {run.last_checkpoint_step}{how}"
                    finish_run(session, run, RunState.completed, message, **ended)
            elif reply.state == "error":
                run.error = reply.error
                finish_run(session, run, RunState.failed, ((reply.error or "").splitlines() or [""])[0])
            else:
                gone = False
        # Only once committed: a failed commit leaves both to the next poll (the records are re-sent).
        for listener in self.listeners:
            listener.notify(worker.run_id)
        worker.started = True
        worker.storage_seen = seen
        if reply.records:
            worker.after_step = max(r.step for r in reply.records)
        if gone:
            self._kill(worker)
        return gone

    def _worker_died(self, worker: Worker, exc: BaseException) -> None:
        self.workers.pop(worker.run_id, None)
        self.pool.kill(worker.node, worker.name)  # a worker given up on never trains on unseen
        text = strip_ansi(str(exc)).strip()
        message = text.splitlines()[0] if text else type(exc).__name__
        with session_scope(self.settings.database_url) as session:
            run = session.get(Run, worker.run_id)
            if run is None:
                return
            requeue_run(session, run, f"worker {worker.name} died ({message})", self.settings.max_retries)

    def _expire_unplaced(self, now: float) -> None:
        """Kill workers that Ray has not placed (no poll reply) within start_timeout_s; each counts as died."""
        limit = self.settings.start_timeout_s
        for worker in list(self.workers.values()):
            if not worker.started and now - worker.launched_at > limit:  # _worker_died kills it
                self._worker_died(worker, TimeoutError(f"not started within start_timeout_s={limit:g} s"))

    def _kill(self, worker: Worker) -> None:
        self.workers.pop(worker.run_id, None)
        self.pool.kill(worker.node, worker.name)  # False: the node or the worker is gone already

    # stops -------------------------------------------------------------------------------------------

    def _send_stops(self) -> None:
        if not self.workers:
            return
        with session_scope(self.settings.database_url) as session:
            wanted = session.scalars(
                select(Run.id).where(Run.id.in_(list(self.workers)), Run.being_stopped)
            ).all()
        for run_id in wanted:
            self._request_stop(self.workers[run_id])

    def _request_stop(self, worker: Worker) -> None:
        if not worker.stop_sent:
            worker.stop_sent = True
            self.pool.stop(worker.node, worker.name)
