"""Forward what the controller ingested to the experiment trackers a grid names, off the launcher's path.

One thread per tracker (a lane), so a tracker that hangs delays no other tracker and never the launcher:
the launcher only `notify`s a run id (a queue put), and each lane also looks for due runs every
launcher interval, which catches state changes and what was ingested while it slept. The database is
the queue: a lane reads a run's checkpoints and events after its cursor (the `tracker_runs` row), sends
them, and moves the cursor after each checkpoint, so a restarted controller sends nothing twice (at most
the one checkpoint in flight when it died) and a tracker that was down gets everything once it answers.

A tracker call is tried `tracker_retries` times; when all fail the run gets an event ("tracker wandb:
unreachable, 3 retries: ...") once per outage, the lane leaves that run for a pause that doubles up to
`tracker_backoff_max_s`, and the run itself never notices.

Each run is forwarded on its own: what a node wrote for one run (a sample that is no PNG, one too large)
is left out of its checkpoint and named in that run's events, and any other error in one run's forwarding
is recorded on that run and paused like an outage; the pass goes on with the other runs. What leaves for a
tracker is the spec as every reader sees it (`hide_env`: a command arm's env values never leave), and an
error's text is stored and logged with the password of any URL in it masked (a tracker's URL often has one).
After its runs, a lane sends each grid's effects table when a new one is stored (grid_verdict.py).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from model.spec import STANDIN
from orchestrator.db.events import record_event
from orchestrator.db.models import Event, Grid, Metric, Run, TrackerRun, utcnow
from orchestrator.db.session import session_scope
from orchestrator.messages import masked_text
from orchestrator.results.judge import judge_metric
from orchestrator.results.views import hide_env
from orchestrator.runs.checkpoint import EXTRACTOR_SUFFIX
from orchestrator.settings import Settings
from orchestrator.trackers.base import (
    FIRST_RETRY_WAIT_S,
    TRACKER_EVENT,
    Note,
    Opened,
    Point,
    Sink,
    Status,
    TrackedRun,
    TrackerUnavailable,
    tracked_name,
)
from orchestrator.trackers.cursor import tracker_cursor
from orchestrator.trackers.grid_end import ended_groups
from orchestrator.trackers.grid_verdict import EffectsSender
from orchestrator.trackers.sample_images import checkpoint_images
from orchestrator.vocabulary import TERMINAL_STATES, TrackerName

log = logging.getLogger("ablate.trackers")

# The run events a tracker gets as notes: state changes and the detector's word. Not `checkpoint` (the
# metrics are the checkpoint) nor `tracker` (its own outages).
FORWARDED_EVENTS = frozenset(
    {"started", "resumed", "worker_lost", "grown", "stop_requested", "warning", "decision", "stopped", "completed",
     "failed"}
)
CHECKPOINTS_PER_PASS = 100  # a long run's backlog goes out in slices, each cursor move committed
MAX_LABEL_CHARS = 200  # an extractor's label as a tracker shows it
T = TypeVar("T")


def build_sink(name: TrackerName, settings: Settings) -> Sink:
    """The sink of tracker `name`, importing its client only now (the grid's submission checked it is there)."""
    if name == TrackerName.tensorboard:
        from orchestrator.trackers.tensorboard_sink import TensorBoardSink

        return TensorBoardSink(settings.tensorboard_root)
    if name == TrackerName.mlflow:
        from orchestrator.trackers.mlflow_sink import MlflowSink

        return MlflowSink(settings.home_dir)
    if name == TrackerName.wandb:
        from orchestrator.trackers.wandb_sink import WandbSink

        return WandbSink(settings.home_dir / "wandb")
    raise ValueError(f"unknown tracker {name!r}")


# -- what a run owes a tracker (read from the database) ------------------------------------------------


@dataclass
class Due:
    """What one run owes one tracker now: checkpoints after its cursor, events after it, its state."""

    run: Run  # detached: its checkpoint_dir and checkpoint_url locate the sample images
    tracked: TrackedRun
    opened: bool  # the tracker run exists (a resume continues it)
    # (step, the point as ingest stores it, the row's extra with its sample manifest), in step order
    metrics: list[tuple[int, dict[str, Any], dict[str, Any]]]
    notes: list[tuple[int, Note]]  # (event id, note), oldest first
    status: Status


def read_due(session: Session, tracker: TrackerName, run_id: int) -> Due | None:
    """What `run_id` owes `tracker`, or None (nothing new, or its tracker run is closed)."""
    from orchestrator.runs.ingest import metric_series

    run = session.get(Run, run_id)
    if run is None:
        return None
    grid = session.get_one(Grid, run.grid_id)
    cursor = tracker_cursor(session, tracker, grid.id, run.id)
    group = tracker_cursor(session, tracker, grid.id, None)
    if cursor.closed:
        return None
    # Events, then the run's state, then its checkpoints, each read after the one before: a final event
    # seen here is matched by a final state, and every checkpoint committed before it is read too.
    history = session.scalars(
        select(Event).where(Event.run_id == run.id, Event.kind.in_(FORWARDED_EVENTS)).order_by(Event.id)
    ).all()  # every event so far: a tracker keeps the whole list, the new ones are the notes
    events = [e for e in history if e.id > (cursor.event_id or 0)]
    session.refresh(run)
    after = cursor.step if cursor.step is not None else -1
    pending = [p for p in metric_series(session, run.id) if p["step"] > after]
    points = pending[:CHECKPOINTS_PER_PASS]
    extras = dict(
        session.execute(select(Metric.step, Metric.extra).where(Metric.run_id == run.id, Metric.step > after)).all()
    )
    if not points and not events and cursor.external_id is not None:
        return None
    noted = {e.id: Note(e.kind, e.message, int((e.data or {}).get("step") or run.last_checkpoint_step or 0))
             for e in history}  # fmt: skip
    notes = [(e.id, noted[e.id]) for e in events]
    judged = judge_metric(run, points[-1].get("lpips_backbone") == STANDIN) if points else None
    spec = hide_env(dict(run.spec or {}))  # what every reader sees: env values stay on the run's node
    name = tracked_name(run.arm, run.seed, grid.seeds)  # a replicate is a tracker run (a TensorBoard folder)
    tracked = TrackedRun(run.id, name, grid.id, grid.name, spec, cursor.external_id, group.external_id)
    caught_up = len(pending) == len(points)
    status = Status(
        state=run.state,
        decision=run.decision,
        decision_step=run.decision_step,
        decision_reason=run.decision_reason,
        best_step=run.best_step,
        best_value=run.best_value,
        judged_metric=judged,
        ended=run.state in TERMINAL_STATES and caught_up,
        notes=tuple(note for _, note in notes),
        events=tuple(noted.values()),
    )
    metrics = [(p["step"], p, extras.get(p["step"]) or {}) for p in points]
    return Due(run, tracked, cursor.external_id is not None, metrics, notes, status)


def scalars_of(point: dict[str, Any], judged: str) -> dict[str, float]:
    """A checkpoint's numbers for a tracker (metrics, their SEs and n, throughput...), plus `judged`."""
    out = {
        key: float(value)
        for key, value in point.items()
        if key != "step" and isinstance(value, int | float) and not isinstance(value, bool)
    }
    if judged in out:
        out["judged"] = out[judged]
    return out


def labels_of(point: dict[str, Any]) -> dict[str, str]:
    """A checkpoint's extractor labels (`<metric>_extractor`), each cut to MAX_LABEL_CHARS: a node wrote them."""
    return {key: value[:MAX_LABEL_CHARS] for key, value in point.items()
            if key.endswith(EXTRACTOR_SUFFIX) and isinstance(value, str)}  # fmt: skip


def due_runs(session: Session, tracker: TrackerName) -> list[int]:
    """Runs of grids naming `tracker` with checkpoints or events its cursor has not passed, oldest first."""
    grids = [gid for gid, names in session.execute(select(Grid.id, Grid.trackers)) if tracker in (names or [])]
    if not grids:
        return []
    rows = session.scalars(select(TrackerRun).where(TrackerRun.tracker == tracker, TrackerRun.grid_id.in_(grids)))
    cursors = {row.run_id: row for row in rows if row.run_id is not None}
    runs = session.scalars(select(Run.id).where(Run.grid_id.in_(grids)).order_by(Run.id)).all()
    open_runs = [r for r in runs if r not in cursors or not cursors[r].closed]
    if not open_runs:
        return []
    steps = dict(
        session.execute(select(Metric.run_id, func.max(Metric.step)).where(Metric.run_id.in_(open_runs))
                        .group_by(Metric.run_id)).all()
    )  # fmt: skip
    events = dict(
        session.execute(
            select(Event.run_id, func.max(Event.id))
            .where(Event.run_id.in_(open_runs), Event.kind.in_(FORWARDED_EVENTS))
            .group_by(Event.run_id)
        ).all()
    )
    due = []
    for run_id in open_runs:
        cursor = cursors.get(run_id)
        seen_step = cursor.step if cursor is not None and cursor.step is not None else -1
        seen_event = cursor.event_id if cursor is not None and cursor.event_id is not None else 0
        if (steps.get(run_id) is not None and steps[run_id] > seen_step) or (events.get(run_id) or 0) > seen_event:
            due.append(run_id)
    return due


# -- one tracker's thread ------------------------------------------------------------------------------


@dataclass
class Lane:
    """One tracker's queue, thread and memory of which runs it has open and which are pausing."""

    name: TrackerName
    effects: EffectsSender  # its grids' effects tables (grid_verdict.py)
    wake: queue.Queue[int] = field(default_factory=queue.Queue)
    sink: Sink | None = None
    opened: set[int] = field(default_factory=set)  # runs opened (or resumed) by this process
    retry_at: dict[int, float] = field(default_factory=dict)  # run id -> monotonic time of its next try
    thread: threading.Thread | None = None


class Forwarder:
    """The tracker lanes of one controller. `start()` runs them in daemon threads; `notify(run_id)` after a
    commit that stored something of the run; `forward(name)` is one lane's pass (tests call it)."""

    def __init__(self, settings: Settings, sinks: dict[TrackerName, Sink] | None = None) -> None:
        self.settings = settings
        self.lanes = {name: Lane(name, EffectsSender(settings, name), sink=(sinks or {}).get(name))
                      for name in TrackerName}  # fmt: skip
        self._halt = threading.Event()

    def start(self) -> None:
        for lane in self.lanes.values():
            lane.thread = threading.Thread(target=self._run_lane, args=(lane,), name=f"ablate-{lane.name}", daemon=True)
            lane.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the lanes and let go of their open tracker runs (not finished: the next controller resumes
        them). A lane stuck in a tracker call is left behind after `timeout` (a daemon thread)."""
        self._halt.set()
        for lane in self.lanes.values():
            lane.wake.put(0)
        deadline = time.monotonic() + timeout
        for lane in self.lanes.values():
            if lane.thread is not None:
                lane.thread.join(max(0.0, deadline - time.monotonic()))
            if lane.thread is None or not lane.thread.is_alive():
                self._close_all(lane)

    def notify(self, run_id: int) -> None:
        """Something of `run_id` was committed: the lanes look at it now. Never blocks."""
        for lane in self.lanes.values():
            lane.wake.put_nowait(run_id)

    def housekeeping(self) -> None:
        pass  # the lanes wake on their own every interval

    def _run_lane(self, lane: Lane) -> None:
        while not self._halt.is_set():
            try:
                lane.wake.get(timeout=self.settings.launcher_interval_s)
                while not lane.wake.empty():  # one pass serves every notification so far
                    lane.wake.get_nowait()
            except queue.Empty:
                pass
            if self._halt.is_set():
                break
            try:
                self.forward(lane.name)
            except Exception as exc:  # a DB hiccup must not end the lane; the next pass retries
                error = masked_text(f"{type(exc).__name__}: {exc}")
                log.error("tracker %s: forwarding pass failed: %s", lane.name, error)

    def forward(self, name: TrackerName) -> None:
        """One pass of tracker `name`: every due run, each as far as it goes (or until the tracker fails)."""
        lane = self.lanes[name]
        with session_scope(self.settings.database_url) as session:
            runs = due_runs(session, name)
        now = time.monotonic()
        for run_id in runs:
            if self._halt.is_set():
                return
            if lane.retry_at.get(run_id, 0.0) > now:
                continue
            try:
                self._forward_run(lane, run_id)
            except Exception as exc:  # noqa: BLE001 - one run's error is that run's, never the pass's
                self._failed(lane, run_id, f"tracker {lane.name}: could not forward run {run_id}: "
                             f"{type(exc).__name__}: {exc}")  # fmt: skip
        # Then each grid's effects table (a W&B run still open gets it before its end finishes it).
        lane.effects.send_due(lambda: self._sink(lane), lambda what, call: self._attempt(lane, what, call),
                              self._halt.is_set)  # fmt: skip
        self._finish_groups(lane)

    def _sink(self, lane: Lane) -> Sink:
        if lane.sink is None:
            lane.sink = self._attempt(lane, "starting its client", lambda: build_sink(lane.name, self.settings))
        return lane.sink

    def _finish_groups(self, lane: Lane) -> None:
        """Finish the tracker run of each grid that ended (an MLflow parent run); one that fails is tried again
        on the next pass."""
        with session_scope(self.settings.database_url) as session:
            ended = ended_groups(session, lane.name)
        for group in ended:
            if self._halt.is_set():
                return
            try:
                sink = self._sink(lane)  # a restarted controller's first call may be a grid's end
                self._attempt(lane, f"finishing grid {group.grid_id}", lambda s=sink, g=group: s.finish_group(g))
            except TrackerUnavailable as exc:
                log.warning("%s (grid %s)", masked_text(str(exc)), group.grid_id)
                continue
            with session_scope(self.settings.database_url) as session:
                tracker_cursor(session, lane.name, group.grid_id, None).closed = True

    def _forward_run(self, lane: Lane, run_id: int) -> None:
        with session_scope(self.settings.database_url) as session:
            due = read_due(session, lane.name, run_id)
        if due is None:
            return
        try:
            self._send(lane, due)
        except TrackerUnavailable as exc:
            self._failed(lane, run_id, str(exc))
            return
        lane.retry_at.pop(run_id, None)

    def _send(self, lane: Lane, due: Due) -> None:
        sink = self._sink(lane)
        run_id = due.run.id
        if run_id not in lane.opened:
            opened: Opened = self._attempt(lane, "opening the run", lambda: sink.open(due.tracked))
            lane.opened.add(run_id)
            self._save(lane, due, external_id=opened.external_id, group_id=opened.group_id)
        for step, point, extra in due.metrics:
            try:
                judged = judge_metric(due.run, point.get("lpips_backbone") == STANDIN)
                samples = checkpoint_images(due.run, step, extra, self.settings.checkpoint_options)
                checkpoint = Point(step, scalars_of(point, judged), judged, tuple(samples.images), labels_of(point))
            except Exception as exc:  # noqa: BLE001 - a record a node wrote that this lane cannot read: its refusal
                self._save(lane, due, step=step, note=f"tracker {lane.name}: step {step}: not forwarded: "
                           f"{type(exc).__name__}: {exc}")  # fmt: skip
                continue
            self._attempt(lane, f"step {step}", lambda c=checkpoint: sink.checkpoint(run_id, c))
            refusal = samples.refusal()
            self._save(lane, due, step=step, note=f"tracker {lane.name}: step {step}: {refusal}" if refusal else None)
        if due.notes or not due.opened or due.status.ended:
            self._attempt(lane, "the run's state", lambda: sink.status(run_id, due.status))
            last_event = due.notes[-1][0] if due.notes else None
            self._save(lane, due, event_id=last_event, closed=due.status.ended)
            if due.status.ended:
                lane.opened.discard(run_id)

    def _attempt(self, lane: Lane, what: str, call: Callable[[], T]) -> T:
        """`call`, tried tracker_retries times; TrackerUnavailable naming the tracker when every try failed."""
        tries = self.settings.tracker_retries
        for i in range(tries):
            try:
                return call()
            except Exception as exc:  # noqa: BLE001 - whatever the client raises: the tracker did not take it
                if i + 1 == tries:
                    raise TrackerUnavailable(
                        f"tracker {lane.name}: unreachable, {tries} retries ({what}): {type(exc).__name__}: {exc}"
                    ) from exc
                log.info("tracker %s: %s failed (%s), trying again", lane.name, what, masked_text(str(exc)))
                self._halt.wait(min(FIRST_RETRY_WAIT_S * 2**i, self.settings.tracker_backoff_max_s))
        raise AssertionError("unreachable")  # tries >= 1 (settings)

    def _save(self, lane: Lane, due: Due, note: str | None = None, **moved: Any) -> None:
        """Move the run's cursor (and clear a failure streak, saying so on the run); `note`: what the moved
        past checkpoint left out, recorded on the run with the move."""
        group_id = moved.pop("group_id", None)
        with session_scope(self.settings.database_url) as session:
            cursor = tracker_cursor(session, lane.name, due.tracked.grid_id, due.run.id)
            if note is not None:
                note = masked_text(note)
                log.warning("%s (run %s)", note, due.run.id)
                record_event(session, session.get_one(Run, due.run.id), TRACKER_EVENT, note[:1000],
                             tracker=str(lane.name))  # fmt: skip
            if group_id is not None:
                tracker_cursor(session, lane.name, due.tracked.grid_id, None).external_id = group_id
            for key, value in moved.items():
                if value is not None:
                    setattr(cursor, key, value)
            if cursor.failures:
                run = session.get(Run, due.run.id)
                if run is not None:
                    record_event(session, run, TRACKER_EVENT, f"tracker {lane.name}: forwarding again after "
                                 f"{cursor.failures} failed attempt(s)", tracker=str(lane.name))
                cursor.failures, cursor.last_error = 0, None
            cursor.updated_at = utcnow()

    def _failed(self, lane: Lane, run_id: int, error: str) -> None:
        """Record the outage on the run (its first failure only) and pause the run's forwarding."""
        error = masked_text(error)
        log.warning("%s (run %s)", error, run_id)
        with session_scope(self.settings.database_url) as session:
            run = session.get(Run, run_id)
            if run is None:
                return
            cursor = tracker_cursor(session, lane.name, run.grid_id, run.id)
            cursor.failures += 1
            cursor.last_error = error[:4000]
            cursor.updated_at = utcnow()
            failures = cursor.failures
            if failures == 1:
                record_event(session, run, TRACKER_EVENT, error[:1000], tracker=str(lane.name))
        pause = min(self.settings.tracker_backoff_max_s, FIRST_RETRY_WAIT_S * 2**failures)
        lane.retry_at[run_id] = time.monotonic() + pause
        if lane.sink is not None and run_id in lane.opened:
            lane.opened.discard(run_id)  # reopen (resume) on the next try: the client may have dropped it
            try:
                lane.sink.close(run_id)
            except Exception as exc:  # noqa: BLE001 - it is down already; the reopen starts clean
                log.debug("tracker %s: closing run %s after a failure failed: %s", lane.name, run_id,
                          masked_text(str(exc)))  # fmt: skip

    def _close_all(self, lane: Lane) -> None:
        for run_id in list(lane.opened):
            try:
                if lane.sink is not None:
                    lane.sink.close(run_id)
            except Exception as exc:  # noqa: BLE001 - shutting down: nothing is lost, the cursor is in the database
                log.warning("tracker %s: closing run %s failed: %s", lane.name, run_id, masked_text(str(exc)))
        lane.opened.clear()
