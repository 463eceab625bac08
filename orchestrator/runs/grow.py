"""An arm already running grows onto GPUs that others freed, when the night plan says it pays.

A data-parallel arm's ranks each draw the whole global batch and its noise and take their slice
(worker/world.py), so its checkpoint resumes on more GPUs with the same global batch and the same
arithmetic (worker/micro_batch.py resumed_micro_batch): growing is a stop and a resume.

- Who may grow: a running run of a `gpus_per_arm: auto` grid whose arm is the plan's to size (it names no
  `gpus`: an explicit count is kept as given), onto GPUs no worker holds on its own node, to a GPU count
  (1, 2, 4, ...) that its batch divides into.
- Whose hours: each live run's hours left (runs/replan.py `remaining_hours`): a record's rate moves only its
  own run's, within bounds of what the plan expects, so a node claiming its run crawls cannot hold the
  grid's night and keep every other arm from growing; past the bounds the plan's projection stands, and
  within them the run's hours left are at most what the pace the controller saw its records arrive at says.
- When: the plan drawn from now with the arm on the larger count (its hours left over the speedup, the
  grid's queued runs placed around it) ends the grid's night earlier than the plan with it kept, by more
  than the growth costs. The cost is `grow_resume_s` (the restart from the stored compile cache: about
  17 s) plus the evaluation of the checkpoint the stop writes (the run's last `eval_time_s`). Of several
  arms on one node, the one whose growth shortens its night most: one growth per node and launch pass.
- How: its spec takes the new count and the freed GPUs count as its worker's (nothing else takes them),
  a `grow_requested` event says from, to and why, and its worker is asked to stop as a user's stop does:
  at its next step, a checkpoint written. The worker ends "stopping" although no one stopped the run; the
  run goes back to the queue as a new attempt (a growth is not counted against max_retries), a `grown`
  event says from, to and the step, and it is launched first, on the same node, where it resumes from that
  checkpoint at the new count. Its records continue its series (ingest keeps one record per step).

A controller that restarts between the growth and the resume keeps the GPUs held (the adopted worker holds
its spec's count, and its stop is sent again) but not the place in front of the queue: the run is then
launched as its plan says.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session

from model.spec import ArmSpec
from orchestrator.db.events import record_event
from orchestrator.db.models import Event, Metric, Run, utcnow
from orchestrator.db.session import session_scope
from orchestrator.grids.gpu_share import splits
from orchestrator.grids.night import PlanPublic, run_name
from orchestrator.grids.planner import PlanNode, PlanRun, Scaling, gpu_choices, plan_night, speedup
from orchestrator.runs.placement import Worker
from orchestrator.runs.replan import evaluation_s, plan_scaling, remaining_hours, run_choices
from orchestrator.runs.run_end import GROWN, finish_run
from orchestrator.settings import Settings
from orchestrator.vocabulary import RunState

log = logging.getLogger("ablate.grow")

ASKED = "grow_requested"  # the run's event: its growth decided, its worker asked to stop (GROWN: re-queued)


class HasGpus(Protocol):
    gpus: int  # a node's GPUs (fleet/node_pool.py NodeEntry)


@dataclass(frozen=True)
class LiveArm:
    """A running run as the grow rule sees it: where, on how many GPUs, its hours left there, and the GPU
    counts it may take (empty: it may not grow)."""

    run_id: int
    grid_id: int
    node: str
    gpus: int
    hours_left: float
    choices: tuple[int, ...] = ()


@dataclass(frozen=True)
class Growth:
    run_id: int
    node: str
    from_gpus: int
    to_gpus: int
    night_h: float  # the grid's night from now with the arm kept
    grown_night_h: float  # with the arm on to_gpus (the growth's cost not included)


def grid_night(arm: LiveArm, gpus: int, live: Sequence[LiveArm], queued: Sequence[PlanRun],
               nodes: Mapping[str, int], scaling: Scaling | None) -> float:
    """Hours from now until the arm's grid ends, with the arm on `gpus` GPUs: its hours left scaled, every
    other live arm holding its GPUs until its own end, the grid's queued runs planned around them."""
    busy: dict[str, list[float]] = {n: [] for n in nodes}
    ends = []
    scaled = arm.hours_left * speedup(arm.gpus, scaling) / speedup(gpus, scaling)
    for other, g, left in [(arm, gpus, scaled), *((a, a.gpus, a.hours_left) for a in live if a.run_id != arm.run_id)]:
        if other.node in busy:
            busy[other.node] += [left] * g
        if other.grid_id == arm.grid_id:
            ends.append(left)
    plan = plan_night(queued, [PlanNode(n, g, tuple(sorted(t for t in busy[n] if t > 0))[:g])
                               for n, g in nodes.items() if g], scaling)
    return max([*ends, *(s.end for s in plan.slots)], default=0.0)


def grow_choice(arm: LiveArm, live: Sequence[LiveArm], queued: Sequence[PlanRun], nodes: Mapping[str, int],
                free: int, scaling: Scaling | None, cost_h: float) -> Growth | None:
    """The GPU count the arm should grow to with `free` GPUs of its node free, or None: none of the counts
    it may take ends its grid's night earlier by more than `cost_h` (the growth's cost, in hours)."""
    wider = [g for g in arm.choices if arm.gpus < g <= arm.gpus + free]
    if not wider or arm.hours_left <= 0:
        return None
    kept = grid_night(arm, arm.gpus, live, queued, nodes, scaling)
    best = min(wider, key=lambda g: (grid_night(arm, g, live, queued, nodes, scaling), g))
    grown = grid_night(arm, best, live, queued, nodes, scaling)
    if not (math.isfinite(kept) and math.isfinite(grown)) or kept - grown <= cost_h:
        return None  # a night that is no number judges nothing (inf - inf is NaN: no comparison holds)
    return Growth(arm.run_id, arm.node, arm.gpus, best, kept, grown)


class Grower:
    """Each launch pass, offers the GPUs left free to the running auto arms (`offer`); holds a grown run's
    node for its resume (`first`, `node_for`). `now` is the clock (tests pass a fake one)."""

    def __init__(self, settings: Settings, nodes: Callable[[], Mapping[str, HasGpus]],
                 now: Callable[[], datetime] = utcnow) -> None:
        self.settings = settings
        self.nodes = nodes  # the nodes runs may be placed on (the launcher's node pool's placeable())
        self.now = now
        self.reserved: dict[int, str] = {}  # run id -> the node its growth freed GPUs on
        self._tried: object = None  # what the last offer rested on: unchanged, no plan is drawn again

    def offer(self, workers: Mapping[int, Worker], free: Mapping[str, int], stop: Callable[[Worker], None]
              ) -> list[Growth]:
        """Grow the running arms the rule says to onto the `free` GPUs (node -> GPUs no worker holds); `stop`
        asks a worker to stop (the launcher's)."""
        nodes = {name: entry.gpus for name, entry in self.nodes().items()}
        open_nodes = {n for n, g in free.items() if g > 0}
        candidates = {w.run_id for w in workers.values() if w.started and not w.stop_sent and w.node in open_nodes}
        basis = (tuple(sorted((w.run_id, w.node, w.gpus, w.started, w.stop_sent) for w in workers.values())),
                 tuple(sorted(free.items())), tuple(sorted(nodes.items())))
        if basis == self._tried:
            return []
        self._tried = basis
        grown: list[Growth] = []
        with session_scope(self.settings.database_url) as session:
            self._stop_asked(session, workers, stop)
            if not candidates:
                return []
            runs = {r.id: r for r in session.scalars(select(Run).where(Run.id.in_(list(workers)))).all()}
            now = self.now()
            live = [LiveArm(r.id, r.grid_id, workers[r.id].node, workers[r.id].gpus,
                            remaining_hours(r, workers[r.id].gpus, now), growable(r, nodes.get(workers[r.id].node, 0)))
                    for r in runs.values()]  # fmt: skip
            found = []
            for arm in live:
                run = runs[arm.run_id]
                if not arm.choices or arm.run_id not in candidates:
                    continue
                plan = run.grid.plan or {}
                scaling = plan_scaling(plan)
                choice = grow_choice(arm, live, queued_runs(session, run, max(nodes.values())), nodes,
                                     free[arm.node], scaling, self.cost_s(session, run) / 3600)
                if choice is not None:
                    found.append(choice)
            # One growth per node and pass (the others' plans assumed its GPUs free): the one that gains most.
            for choice in sorted(found, key=lambda c: (c.grown_night_h - c.night_h, c.run_id)):
                if all(g.node != choice.node for g in grown):
                    self._ask(session, runs[choice.run_id], workers[choice.run_id], choice)
                    grown.append(choice)
        for choice in grown:  # once committed: a stop asked is a growth on record
            stop(workers[choice.run_id])
        return grown

    def _stop_asked(self, session: Session, workers: Mapping[int, Worker], stop: Callable[[Worker], None]) -> None:
        """Stop the workers whose growth is on record but whose stop may never have been sent: a controller
        that ended between the two adopts them (holding the grown count) and would else hold GPUs idle."""
        unsent = {w.run_id: w for w in workers.values() if not w.stop_sent}
        if not unsent:
            return
        asked = select(Event.run_id, Event.data).where(Event.run_id.in_(list(unsent)), Event.kind == ASKED)
        rows = session.execute(asked)
        for run_id, data in rows:
            if (data or {}).get("attempt") == unsent[run_id].attempt and not unsent[run_id].stop_sent:
                stop(unsent[run_id])

    def cost_s(self, session: Session, run: Run) -> float:
        """What growing costs the run: the restart, and the evaluation of the checkpoint its stop writes."""
        extra = session.scalars(
            select(Metric.extra).where(Metric.run_id == run.id).order_by(Metric.step.desc()).limit(1)
        ).first()
        return self.settings.grow_resume_s + evaluation_s(extra)

    def _ask(self, session: Session, run: Run, worker: Worker, choice: Growth) -> None:
        run.spec = {**run.spec, "gpus": choice.to_gpus}
        worker.gpus = choice.to_gpus  # the freed GPUs are its from now: no queued run takes them
        record_event(session, run, ASKED,
                     f"growing from {choice.from_gpus} to {choice.to_gpus} GPUs on node {choice.node} at its next "
                     f"step: the grid's night {choice.night_h:.2f} h -> {choice.grown_night_h:.2f} h from now",
                     step=run.last_checkpoint_step, from_gpus=choice.from_gpus, to_gpus=choice.to_gpus,
                     attempt=run.retries, node_name=choice.node, night_h=round(choice.night_h, 4),
                     grown_night_h=round(choice.grown_night_h, 4))
        log.info("run %s grows from %d to %d GPUs on node %s", run.id, choice.from_gpus, choice.to_gpus, choice.node)

    # the resume ------------------------------------------------------------------------------------------

    def asked(self, session: Session, run: Run) -> dict[str, Any] | None:
        """The growth its current attempt was asked to stop for (the ASKED event's data), None if none: a
        worker that ends "stopping" while no one stops its run stopped for it."""
        if run.being_stopped:
            return None  # a user's or the detector's stop since: that one wins
        data = session.scalars(select(Event.data).where(Event.run_id == run.id, Event.kind == ASKED)
                               .order_by(Event.id.desc()).limit(1)).first()
        return data if data and data.get("attempt") == run.retries else None

    def ended(self, session: Session, run: Run, node: str, asked: dict[str, Any]) -> None:
        """Its worker stopped for a growth: completed if it reached its last step meanwhile, else queued
        again at its new count as a new attempt, its node held for it."""
        spec = ArmSpec.model_validate(run.spec)
        if (run.last_checkpoint_step or 0) >= spec.schedule.steps:
            finish_run(session, run, RunState.completed, f"finished at step {run.last_checkpoint_step}")
            return
        run.retries += 1
        run.state = RunState.queued
        record_event(session, run, GROWN,
                     f"grown from {asked.get('from_gpus')} to {spec.gpus} GPUs at step {run.last_checkpoint_step}; "
                     f"attempt {run.retries} resumes on node {node}",
                     step=run.last_checkpoint_step, from_gpus=asked.get("from_gpus"), to_gpus=spec.gpus,
                     attempt=run.retries, node_name=node)
        self.reserved[run.id] = node

    def first(self, queued: Sequence[Run]) -> list[Run]:
        """The queue with the grown runs in front: their GPUs are free because they freed them. (A grown run
        that left the queue otherwise, stopped, holds nothing any more.)"""
        self.reserved = {run.id: self.reserved[run.id] for run in queued if run.id in self.reserved}
        return sorted(queued, key=lambda r: r.id not in self.reserved)

    def node_for(self, run: Run, free: Mapping[str, int]) -> str | None:
        """The node a grown run resumes on (its own), while it has the run's GPUs free; else None."""
        node = self.reserved.pop(run.id, None)
        if node is None or free.get(node, 0) < ArmSpec.model_validate(run.spec).gpu_count():
            return None
        return node


def growable(run: Run, node_gpus: int) -> tuple[int, ...]:
    """The GPU counts a running run may take: those its batch divides into up to its node's GPUs, where its
    grid is auto and its arm the plan's to size; () otherwise (an explicit `gpus`, a command arm)."""
    plan = run.grid.plan or {}
    if run.state != RunState.running or run.being_stopped or not plan.get("auto") \
            or run.arm not in (plan.get("moldable") or []):
        return ()
    spec = ArmSpec.model_validate(run.spec)
    if spec.command is not None:
        return ()
    return tuple(g for g in gpu_choices(node_gpus) if splits(spec, g))


def queued_runs(session: Session, run: Run, largest: int) -> list[PlanRun]:
    """The run's grid's queued runs with projected hours, as its re-planning plans them."""
    plan = PlanPublic.model_validate(run.grid.plan)
    queued = session.scalars(select(Run).where(Run.grid_id == run.grid_id, Run.state == RunState.queued)).all()
    return [PlanRun(run_name(q.arm, q.seed, q.grid.seeds), plan.hours[q.arm], run_choices(q, plan, largest))  # type: ignore[arg-type]
            for q in queued if plan.hours.get(q.arm) is not None and not q.being_stopped]


