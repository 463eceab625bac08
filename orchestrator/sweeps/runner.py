"""The sweep runner: the state machine that takes a fired schedule through its nodes to its results.

A sweep: provision its nodes (rent them when its schedule asks for nodes: rented.py; probe and
bootstrap each, which starts its own Ray and agent), submit its grid through the grid service, wait for
the runs (the run launcher moves them through queued -> ... -> completed | stopped | failed in the DB),
copy checkpoints and metrics back into home_dir/sweeps/<id>/ (copy_back.py: from checkpoint storage,
over SFTP from the node only when storage holds none), tear the nodes down. A budget (sum of node
price per hour x hours since the fire) stops the sweep gracefully: its runs are stopped via the grid
service, then results are collected and the nodes torn down.

Everything is driven by `SweepRunner.tick()` with an injectable clock, so a test (or a controller
that was down) replays time exactly. Cron times are UTC.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.events import record_sweep_event
from orchestrator.db.models import Event, Grid, Node, Schedule, Sweep, utcnow
from orchestrator.db.session import session_scope
from orchestrator.fleet.bootstrap import BootstrapConfig, bootstrap_node, drain, teardown
from orchestrator.fleet.errors import NodeError, error_reason
from orchestrator.fleet.inventory import set_state
from orchestrator.fleet.providers.base import Provider
from orchestrator.fleet.providers.request import NodeRequest
from orchestrator.fleet.shell import NodeShell
from orchestrator.grids.gpu_share import sweep_nodes
from orchestrator.grids.service import GridCreate, GridError, PathPolicy, create_grid, stop_run
from orchestrator.settings import Settings
from orchestrator.sweeps.budget import spend
from orchestrator.sweeps.copy_back import copy_back, results_report
from orchestrator.sweeps.lock import runner_lock
from orchestrator.sweeps.preemption import watch_preemption
from orchestrator.sweeps.rented import RentalConfig, Rentals, rental_config
from orchestrator.sweeps.schedules import aware, fire_times, next_fire
from orchestrator.vocabulary import TERMINAL_STATES, GridSource, NodeState, SweepState, TrackerName

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


class SweepRunner:
    """Fires due schedules and moves each sweep one step along per `tick()`.

    `clock` returns the current UTC time (injectable for tests and replay). `misfire_grace` is how
    late a fire may be and still count as on time; `stop_grace` how long stopped runs get to reach a
    final state before the nodes are torn down anyway (the budget keeps running while we wait).
    A node's teardown is tried `teardown_attempts` times, waiting `teardown_backoff_s` x 2^k between.

    Any runner may tick: only the one holding the runner lock (`runner_lock`) fires or advances
    anything, so `ablate serve` and `ablate schedules run` side by side never run a sweep twice.

    `providers` (those with an API key) and `rental` serve schedules that ask for nodes (a request):
    the sweep rents them at fire and destroys them at its end (orchestrator/sweeps/rented.py), and every
    tick reaps this controller's labelled instances that no live sweep owns.
    """

    def __init__(
        self,
        database_url: str,
        home_dir: Path,
        clock: Clock = utcnow,
        node_config: BootstrapConfig | None = None,
        misfire_grace: timedelta = timedelta(minutes=5),
        stop_grace: timedelta = timedelta(minutes=30),
        teardown_attempts: int = 4,
        teardown_backoff_s: float = 5.0,
        checkpoint_options: dict[str, Any] | None = None,
        copy_back_max_bytes: int | None = None,  # per run; None: sized to its checkpoints
        checkpoint_keep_last: int = Settings.model_fields["checkpoint_keep_last"].default,
        providers: Mapping[str, Provider] | None = None,
        rental: RentalConfig | None = None,
        paths: PathPolicy | None = None,  # the operator's policy a fired grid is held to (commands too)
        trackers: Sequence[TrackerName] = (),  # ABLATE_TRACKERS: for a fired grid that names none
    ) -> None:
        self.paths = paths
        self.trackers = trackers
        self.rentals = Rentals(database_url, dict(providers or {}), rental, self.now)
        self.database_url = database_url
        self.teardown_attempts = teardown_attempts
        self.teardown_backoff_s = teardown_backoff_s
        self.checkpoint_options = checkpoint_options or {}  # fsspec options of checkpoint storage
        self.copy_back_max_bytes, self.checkpoint_keep_last = copy_back_max_bytes, checkpoint_keep_last  # per run
        self.home_dir = Path(home_dir)
        self.clock = clock
        self.node_config = node_config
        self.misfire_grace = misfire_grace
        self.stop_grace = stop_grace

    @classmethod
    def from_settings(cls, settings: Any) -> SweepRunner:  # noqa: ANN401 - orchestrator.settings.Settings
        """The runner `ablate serve` and `ablate schedules run` drive: renting from every provider with a key."""
        from orchestrator.fleet.providers import configured_providers

        return cls(
            settings.database_url,
            settings.home_dir,
            checkpoint_options=settings.checkpoint_options,
            copy_back_max_bytes=settings.copy_back_max_bytes,
            checkpoint_keep_last=settings.checkpoint_keep_last,
            providers=configured_providers(settings),
            rental=rental_config(settings),
            paths=PathPolicy.from_settings(settings),
            trackers=settings.trackers,
        )

    def now(self) -> datetime:
        return aware(self.clock())

    def tick(self) -> bool:
        """Fire what is due, then advance every sweep under way by one step; False (nothing done)
        when another runner holds the lock."""
        with runner_lock(self.database_url) as mine:
            if not mine:
                return False
            self._tick()
            return True

    def _tick(self) -> None:
        now = self.now()
        self.rentals.reap()  # first thing at start-up, then every tick
        self.fire_due(now)
        with session_scope(self.database_url) as session:
            active = list(session.scalars(select(Sweep.id).where(Sweep.under_way).order_by(Sweep.id)))
        for sweep_id in active:
            self.advance(sweep_id, self.now())

    # firing

    def fire_due(self, now: datetime) -> list[int]:
        """Start a sweep for each schedule whose next fire time has come; returns the new sweep ids."""
        fired: list[int] = []
        with session_scope(self.database_url) as session:
            due = session.scalars(
                select(Schedule).where(Schedule.paused.is_(False), Schedule.next_fire_at <= now).order_by(Schedule.id)
            ).all()
            for schedule in due:
                sweep = self._fire(session, schedule, now)
                if sweep is not None:
                    fired.append(sweep.id)
        return fired

    def _fire(self, session: Session, schedule: Schedule, now: datetime) -> Sweep | None:
        assert schedule.next_fire_at is not None
        scheduled_for = aware(schedule.next_fire_at)
        # Every fire time up to now: more than one means the controller was down across several.
        missed = list(fire_times(schedule.cron, scheduled_for, now))
        late = now - scheduled_for > self.misfire_grace
        schedule.next_fire_at = next_fire(schedule.cron, now)
        info = {"schedule": schedule.name, "scheduled_for": scheduled_for.isoformat(), "fire_times": len(missed)}
        if late and schedule.misfire == "skip":
            record_sweep_event(
                session,
                None,
                "schedule.missed",
                f"{schedule.name}: fire of {scheduled_for:%Y-%m-%d %H:%M} UTC "
                f"missed while the controller was down; skipped (misfire=skip)",
                **info,
            )
            return None
        busy = session.scalar(select(Sweep.id).where(Sweep.schedule_id == schedule.id, Sweep.under_way))
        if busy is not None:
            message = f"{schedule.name}: sweep {busy} is still under way; fire skipped"
            record_sweep_event(session, None, "schedule.overlap", message, **info)
            return None
        # Another schedule's sweep on the same node would join it twice and tear it down under the other.
        in_use = {
            (name, other.id)
            for other in session.scalars(select(Sweep).where(Sweep.under_way))
            for name in other.nodes
            if name in schedule.nodes
        }
        if in_use:
            taken = ", ".join(f"{name} (sweep {sid})" for name, sid in sorted(in_use))
            message = f"{schedule.name}: nodes in use by {taken}; fire skipped"
            record_sweep_event(session, None, "schedule.nodes_busy", message, **info)
            return None
        nodes = session.scalars(select(Node).where(Node.name.in_(schedule.nodes))).all()
        sweep = Sweep(
            schedule_id=schedule.id,
            scheduled_for=missed[-1] if late else scheduled_for,
            fired_at=now,
            late=late,
            state=SweepState.provisioning,
            nodes=list(schedule.nodes),
            price_per_hour=sum(n.price_per_hour for n in nodes),
            budget=schedule.budget,
        )
        session.add(sweep)
        schedule.last_fire_at = now
        session.flush()
        when = "late (misfire=run_once)" if late else "on time"
        record_sweep_event(session, sweep, "schedule.fired", f"{schedule.name}: sweep {sweep.id} fired {when}", **info)
        return sweep

    # advancing

    def advance(self, sweep_id: int, now: datetime) -> str:
        """One step of one sweep; returns its state afterwards. Any exception in a step ends the sweep
        `failed`, naming the step and the reason, after tearing down every node it provisioned."""
        with session_scope(self.database_url) as session:
            step = session.get_one(Sweep, sweep_id).state
        try:
            if step == SweepState.provisioning:
                self._provision(sweep_id, now)
            elif step == SweepState.running and self.rentals.providers:
                # A preempted rented node: destroyed, its runs re-queue by themselves, maybe a replacement.
                watch_preemption(self.rentals, sweep_id, lambda n: bootstrap_node(self.database_url, n, self._config()))
            with session_scope(self.database_url) as session:
                sweep = session.get_one(Sweep, sweep_id)
                step = sweep.state
                if sweep.state in (SweepState.running, SweepState.stopping):
                    self._watch(session, sweep, now)
                state = sweep.state
            if state == SweepState.collecting:
                step = state
                self._collect_and_teardown(sweep_id, now)
        except Exception as exc:  # noqa: BLE001 - whatever broke, the sweep must end and its nodes go back
            log.exception("sweep %s failed in %s", sweep_id, step)
            self._fail(sweep_id, str(step), exc)
        with session_scope(self.database_url) as session:
            return session.get_one(Sweep, sweep_id).state

    def _fail(self, sweep_id: int, step: str, exc: BaseException, nodes: list[str] | None = None) -> None:
        """End the sweep `failed` with the step and reason, after stopping its runs and tearing down
        `nodes` (default: every node it provisioned)."""
        reason = error_reason(exc)
        with session_scope(self.database_url) as session:
            sweep = session.get_one(Sweep, sweep_id)
            names = list(sweep.nodes) if nodes is None else nodes
            grid = session.get(Grid, sweep.grid_id) if sweep.grid_id is not None else None
            for run in grid.runs if grid is not None else []:
                if run.state not in TERMINAL_STATES:
                    stop_run(session, run, self.now())
        problems = self._teardown(names, keep_files=set()) + self.rentals.release(sweep_id)
        with session_scope(self.database_url) as session:
            sweep = session.get_one(Sweep, sweep_id)
            sweep.state, sweep.finished_at = SweepState.failed, self.now()
            sweep.error = f"{step}: {reason}" + "".join(f"; {p}" for p in problems)
            sweep.spend = spend(sweep, sweep.finished_at)
            record_sweep_event(session, sweep, "sweep.failed", sweep.error, step=step)

    def _config(self) -> BootstrapConfig:
        return self.node_config or BootstrapConfig()

    def _provision(self, sweep_id: int, now: datetime) -> None:
        with session_scope(self.database_url) as session:
            sweep = session.get_one(Sweep, sweep_id)
            schedule = session.get_one(Schedule, sweep.schedule_id)
            names, grid_body = list(sweep.nodes), dict(schedule.grid)
            label = f"{grid_body.get('name', schedule.name)} @ {aware(sweep.scheduled_for):%Y-%m-%d %H:%M}"
            request = NodeRequest.model_validate(schedule.request) if schedule.request is not None else None
        if request is not None:
            try:
                config = self._config()
                names = self.rentals.rent(sweep_id, request, lambda n: bootstrap_node(self.database_url, n, config))
            except Exception as exc:  # noqa: BLE001 - whatever failed, what was rented goes back
                self._fail(sweep_id, f"renting {request.nodes}x {request.gpus_per_node}x {request.gpu}", exc)
                return
        done: list[str] = []
        for name in names if request is None else []:  # rented nodes were bootstrapped as they came
            try:
                bootstrap_node(self.database_url, name, self._config())  # probe first, then install and join
            except Exception as exc:  # noqa: BLE001 - anything else (an SFTP OSError...) would re-provision every tick
                # The failing node too: it may have joined or half-installed before the failing step.
                self._fail(sweep_id, f"provisioning {name}", exc, nodes=[*done, name])
                return
            done.append(name)
        with session_scope(self.database_url) as session:
            sweep = session.get_one(Sweep, sweep_id)
            grid_body["name"] = label[:200]
            try:
                grid = create_grid(
                    session, GridCreate.model_validate(grid_body), source=GridSource.schedule, paths=self.paths,
                    default_trackers=self.trackers,
                    nodes=sweep_nodes(session, names) or None,  # the sweep's own nodes: its arms run there
                )
            except (ValidationError, GridError) as exc:
                # Arms changed since the schedule was created: nothing can run, so give the nodes back.
                sweep.state, sweep.error = SweepState.collecting, f"grid no longer valid: {exc}"
                record_sweep_event(session, sweep, "sweep.failed", sweep.error)
                return
            sweep.grid_id, sweep.state = grid.id, SweepState.running
            record_sweep_event(
                session,
                sweep,
                "sweep.running",
                f"sweep {sweep.id}: nodes {', '.join(names)} joined; grid {grid.id} "
                f"submitted with {len(grid.runs)} runs",
            )

    def _watch(self, session: Session, sweep: Sweep, now: datetime) -> None:
        sweep.spend = spend(sweep, now)
        grid = session.get(Grid, sweep.grid_id) if sweep.grid_id is not None else None
        runs = list(grid.runs) if grid is not None else []
        pending = [r for r in runs if r.state not in TERMINAL_STATES]
        if sweep.state == SweepState.running and sweep.budget is not None and sweep.spend >= sweep.budget:
            hours = (now - aware(sweep.fired_at)).total_seconds() / 3600
            sweep.stop_reason = (
                f"budget {sweep.budget:g} reached: spent {sweep.spend:.2f} ({hours:.2f} h x {sweep.price_per_hour:g}/h)"
            )
            sweep.state, sweep.stop_requested_at = SweepState.stopping, now
            for run in pending:
                stop_run(session, run, now)
            record_sweep_event(
                session,
                sweep,
                "sweep.budget",
                f"sweep {sweep.id}: {sweep.stop_reason}; stopping {len(pending)} runs",
                spend=sweep.spend,
            )
            pending = [r for r in runs if r.state not in TERMINAL_STATES]
        if not pending:
            sweep.state = SweepState.collecting
        elif sweep.state == SweepState.stopping and now - aware(sweep.stop_requested_at or now) >= self.stop_grace:
            sweep.state = SweepState.collecting
            record_sweep_event(
                session,
                sweep,
                "sweep.stop_timeout",
                f"sweep {sweep.id}: {len(pending)} runs still not stopped after "
                f"{self.stop_grace}; collecting and tearing down anyway",
            )

    def _collect_and_teardown(self, sweep_id: int, now: datetime) -> None:
        with session_scope(self.database_url) as session:
            sweep = session.get_one(Sweep, sweep_id)
            names, grid_id = list(sweep.nodes), sweep.grid_id
        results = self.home_dir / "sweeps" / str(sweep_id)
        results.mkdir(parents=True, exist_ok=True)
        problems, failed_copies = copy_back(self.database_url, self.checkpoint_options, sweep_id, grid_id, names,
                                            results, self.copy_back_max_bytes, keep_last=self.checkpoint_keep_last)
        report_problem = results_report(self.database_url, self.checkpoint_options, grid_id, results)
        problems += self._teardown(names, keep_files=failed_copies) + self.rentals.release(sweep_id)
        with session_scope(self.database_url) as session:
            sweep = session.get_one(Sweep, sweep_id)
            sweep.finished_at = self.now()
            sweep.spend = spend(sweep, sweep.finished_at)
            sweep.results_dir = str(results)
            if problems:
                sweep.error = "; ".join(filter(None, [sweep.error, *problems]))
            sweep.state = (
                SweepState.failed if sweep.error else SweepState.stopped if sweep.stop_reason else SweepState.completed
            )
            if report_problem:  # the results are kept and the sweep's state is its runs': the report is said apart
                record_sweep_event(session, sweep, "sweep.report_failed", f"sweep {sweep.id}: {report_problem}; "
                                   f"the results in {results} are kept (`ablate report` writes it again)")  # fmt: skip
            record_sweep_event(
                session,
                sweep,
                f"sweep.{sweep.state}",
                f"sweep {sweep.id} {sweep.state}: spent {sweep.spend:.2f}; "
                f"results in {results}" + (f"; {sweep.error}" if sweep.error else "")
                + (f"; {report_problem}" if report_problem else ""),
            )

    def _teardown(self, names: list[str], keep_files: set[str]) -> list[str]:
        """Leave the cluster on every node; delete the working dir unless its results could not be copied.

        Never raises: each node is tried `teardown_attempts` times with back-off; one that still fails
        is marked `teardown_failed` (red on the dashboard and in `ablate schedules list`) and named in
        the returned problems, because it may still be running and billing.
        """
        problems = []
        for name in names:
            error: BaseException | None = None
            for attempt in range(self.teardown_attempts):
                if attempt:
                    time.sleep(self.teardown_backoff_s * 2 ** (attempt - 1))
                try:
                    self._teardown_one(name, keep=name in keep_files)
                    error = None
                    break
                except Exception as exc:  # noqa: BLE001 - whatever it is, try again, then report the node
                    error = exc
                    log.warning("tearing down %s, attempt %d: %s", name, attempt + 1, error_reason(exc))
            if error is not None:
                problems.append(
                    f"tearing down {name} failed {self.teardown_attempts} times: {error_reason(error)} "
                    "-- THE NODE MAY STILL BE RUNNING (and billing)"
                )
                with session_scope(self.database_url) as session:
                    row = session.scalar(select(Node).where(Node.name == name))
                    if row is not None:
                        set_state(row, NodeState.teardown_failed)
                        session.add(Event(node_id=row.id, kind="node.teardown_failed", message=problems[-1]))
        return problems

    def _teardown_one(self, name: str, keep: bool) -> None:
        with session_scope(self.database_url) as session:
            node = session.scalar(select(Node).where(Node.name == name))
            if node is None:
                raise NodeError(f"node {name!r} was removed while the sweep ran; tear it down by hand")
            session.expunge(node)
        with NodeShell.open(node, self.database_url) as shell:
            (drain if keep else teardown)(shell, self._config())
        with session_scope(self.database_url) as session:
            row = session.scalar(select(Node).where(Node.name == name))
            if row is not None:
                set_state(row, NodeState.drained if keep else NodeState.registered)

    # the loop

    def run_forever(self, interval_s: float = 30.0, stop: threading.Event | None = None) -> None:
        """Tick every `interval_s` seconds until `stop` is set; a failing tick is logged and recorded."""
        stop = stop or threading.Event()
        while not stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # keep firing schedules even if one tick hit a bad row or a dead DB
                log.exception("sweep tick failed")
                try:
                    with session_scope(self.database_url) as session:
                        record_sweep_event(session, None, "sweep.tick_failed", f"{type(exc).__name__}: {exc}")
                except Exception:
                    log.exception("cannot record the failed tick")
            stop.wait(interval_s)


def attach_sweep_runner(app: Any, interval_s: float = 30.0) -> None:
    """Run a SweepRunner in a background thread for the app's lifetime (startup/shutdown hooks)."""
    stop = threading.Event()

    def start(app: Any) -> None:
        runner = SweepRunner.from_settings(app.state.settings)
        thread = threading.Thread(target=runner.run_forever, args=(interval_s, stop), name="sweeps", daemon=True)
        thread.start()
        app.state.sweep_thread = thread

    def shutdown(app: Any) -> None:
        stop.set()
        thread = getattr(app.state, "sweep_thread", None)
        if thread is not None:
            thread.join(timeout=10)

    app.state.startup_hooks.append(start)
    app.state.shutdown_hooks.append(shutdown)
