"""The night plan redrawn as the night goes: a `gpus_per_arm: auto` grid's queued runs start when, where and
on as many GPUs as the plan drawn from now says (grids/planner.py), and that plan is drawn again whenever
what it rests on changes: a run ended (completed, or early: stopped, failed), a run was re-queued (its
node left), or a node joined or left.

- What is planned: the queued runs of each auto grid, oldest grid first. A run that never started takes
  the GPU counts its batch divides into; one that started before (re-queued, resuming from its checkpoint)
  keeps its count: the one it had, or the one it grew to (runs/grow.py: a running arm grows onto GPUs
  others freed when that shortens the night, its checkpoint resumed at the larger world size).
- What is busy: every live worker holds its GPUs until its projected end (from its own last record: the
  steps left at that window's rate and its evaluations left; before its first record, its run's hours from
  its grid's plan, or the FLOP estimate, over the speedup, less the time since it started; never below
  now), and an earlier grid's runs due now hold theirs for as long as they are planned to take.
- What a node's record may move: its own run's projection, and only within a span of the rate the plan
  expects of it (its single-GPU hours, else the FLOP estimate, over the speedup of the GPUs the record ran
  on): RATE_SPAN of hours measured or given, ESTIMATE_SPAN of a FLOP estimate (an H100 at arm A's rate). A
  rate past that, either way, is a claim the controller cannot check (one record of 1e-6 it/s made a
  run 194,000 h from its end and held the whole grid's night, so no other arm grew): the plan's projection
  stands in for it, and a `progress.claim_refused` event says so once per record. Within the span, a claim
  still moves them no further than the pace the controller saw (runs/observed_pace.py: the steps its records
  reached over the time from the attempt's placement to their arrival, both on the controller's clock): a
  claim 9x (or, of an estimate, 9e4x) slower than that held the grid's night, and a `progress.claim_bounded`
  event says so once per record. Nor faster: a claim more than PACE_SPAN (2x) faster than the pace the
  controller saw between the node's own records (the first of the attempt to the latest, by arrival)
  is replaced by it, with the same event (9e4x faster, inside an estimate's span, made a run's hours left
  about 0, its GPUs free now, and a queued run was due on them). Hours left are finite.
- What starts: the runs whose slot starts now. The others wait for theirs, so a run the plan puts on all
  four GPUs once A ends is not started early on one.
- What is kept: the redrawn plan is stored on the grid (`Grid.plan`, with `drawn_at`), slots of its live
  runs included, and an event says the night it now projects.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, object_session

from model.spec import ArmSpec
from orchestrator.db.models import Event, Grid, Metric, Run, aware, utcnow
from orchestrator.grids.gpu_share import splits
from orchestrator.grids.night import PlanPublic, SlotPublic, run_name
from orchestrator.grids.planner import PlanNode, PlanRun, gpu_choices, plan_night, speedup
from orchestrator.grids.projection import GIVEN, MEASURED
from orchestrator.grids.replicates import projected_gpu_hours
from orchestrator.runs.observed_pace import observed_hours_left, paced_hours_left
from orchestrator.runs.placement import arm_gpus, choose_node
from orchestrator.vocabulary import RunState

log = logging.getLogger("ablate.replan")

DUE_H = 1e-6  # a slot starting within this many hours of now starts now
# A record's rate counts within this factor of the rate its plan expects, either way: the plan's estimate
# is rough (a short run on two H200s took twice its projection), a claim 10x off it is not a measurement
# the plan can stand on.
RATE_SPAN = 10.0
# Of a FLOP estimate (the plan's source "estimated", or no plan): it is an H100's at arm A's rate, and a tiny
# model on a CPU runs 13,000x below it (56 it/s against 725,000), so only a claim past this is refused.
ESTIMATE_SPAN = 1e5
# A claim within this factor faster than the pace seen between its node's records stands: records that arrive
# in bursts make that pace uneven.
PACE_SPAN = 2.0
CLAIM_REFUSED = "progress.claim_refused"  # the run's event: a record's rate out of bounds, the plan kept
CLAIM_BOUNDED = "progress.claim_bounded"  # the run's event: its claim slower (or far faster) than it was seen to go


@dataclass(frozen=True)
class Held:
    """A live worker's place: its node and its GPUs."""

    node: str
    gpus: int


@dataclass(frozen=True)
class Due:
    """Where and on how many GPUs a planned run starts now."""

    node: str
    gpus: int


@dataclass
class Redraws:
    """The launch pass's answer: the runs that start now, and the runs the plans hold back."""

    due: dict[int, Due]
    planned: set[int]  # every queued run a plan placed (due now or later)

    def node_for(self, run: Run, free: Mapping[str, int]) -> str | None:
        """The node a queued run starts on now, its spec resized to its slot's GPUs; None: its slot starts
        later, or no node has room. A run no plan holds goes where it fits (runs/placement.py)."""
        if run.id in self.planned and run.id not in self.due:
            return None
        due = self.due.get(run.id)
        if due is not None:
            resize(run, due.gpus)
            if free.get(due.node, 0) >= due.gpus:
                return due.node
        return choose_node(free, arm_gpus(run.spec))


class Replanner:
    """Redraws the auto grids' plans for each launch pass; `now` is the clock (tests pass a fake one)."""

    def __init__(self, now: Callable[[], datetime] = utcnow) -> None:
        self.now = now
        self._drawn: dict[int, tuple[object, PlanPublic]] = {}  # grid id -> (what it rested on, the plan)

    def redraw(self, session: Session, queued: Sequence[Run], nodes: Mapping[str, int],
               held: Mapping[int, Held]) -> Redraws:
        """The plans of the auto grids with queued runs, from now, over `nodes` (name -> GPUs) with the
        `held` workers' GPUs (run id -> place) busy until their projected ends."""
        out = Redraws({}, set())
        grids: dict[int, list[Run]] = {}
        for run in queued:
            if run.grid.plan and run.grid.plan.get("auto") and not run.being_stopped:
                grids.setdefault(run.grid_id, []).append(run)
        if not grids or not any(nodes.values()):
            return out
        now = self.now()
        live = {r.id: r for r in session.scalars(select(Run).where(Run.id.in_(list(held)))).all()} if held else {}
        busy: dict[str, list[float]] = {name: [] for name in nodes}
        for run_id, place in held.items():
            if place.node in busy and run_id in live:
                busy[place.node] += [remaining_hours(live[run_id], place.gpus, now)] * place.gpus
        for runs in grids.values():
            grid = runs[0].grid
            plan = self._redraw_grid(session, grid, runs, nodes, busy, live, held, now)
            for slot in plan.slots:
                run = next((r for r in runs if _name(r) == slot.run), None)
                if run is None:
                    continue
                out.planned.add(run.id)
                if slot.start_h <= DUE_H:
                    out.due[run.id] = Due(slot.node, slot.gpus)
                    busy[slot.node] += [slot.end_h] * slot.gpus  # held for the next grid's plan
        return out

    def _redraw_grid(self, session: Session, grid: Grid, runs: list[Run], nodes: Mapping[str, int],
                     busy: Mapping[str, list[float]], live: Mapping[int, Run], held: Mapping[int, Held],
                     now: datetime) -> PlanPublic:
        mine = [live[i] for i in held if i in live and live[i].grid_id == grid.id]
        # What the plan rests on: while none of it changes, the last drawing stands (a slot later than now
        # stays later until a run ends or a node comes or goes), so a pass costs no search.
        basis = (frozenset(r.id for r in runs), frozenset(held), tuple(sorted(nodes.items())))
        last = self._drawn.get(grid.id)
        if last is not None and last[0] == basis:
            return last[1]
        stored = PlanPublic.model_validate(grid.plan)
        scaling = {int(g): s for g, s in stored.scaling.items()}
        largest = max(nodes.values())
        plan_runs, unprojected = [], []
        for run in runs:
            hours = stored.hours.get(run.arm)
            if hours is None:
                unprojected.append(_name(run))  # a command arm: launched as any queued run is
                continue
            fixed = stored.fixed_h.get(run.arm, 0.0)
            plan_runs.append(PlanRun(_name(run), hours, run_choices(run, stored, largest), fixed))
        plan_nodes = [PlanNode(n, g, tuple(t for t in busy[n] if t > 0)[:g]) for n, g in nodes.items() if g]
        plan = plan_night(plan_runs, plan_nodes, scaling)
        ends = [plan.night, plan.lower_bound, *(remaining_hours(r, held[r.id].gpus, now) for r in mine)]
        if not all(math.isfinite(h) for h in ends):  # never stored: a page or a later plan would read it
            log.warning("grid %s: a redrawn plan of non-finite hours kept out; the last one stands", grid.id)
            return stored
        started = [
            SlotPublic(run=_name(r), arm=r.arm, seed=r.seed, gpus=held[r.id].gpus, node=held[r.id].node,
                       start_h=round(-_elapsed_h(r, now), 4), end_h=round(remaining_hours(r, held[r.id].gpus, now), 4))
            for r in mine
        ]  # fmt: skip
        owner = {_name(r): r for r in runs}
        redrawn = stored.model_copy(update={
            "slots": started + [
                SlotPublic(run=s.run, arm=owner[s.run].arm, seed=owner[s.run].seed, gpus=s.gpus, node=s.node,
                           start_h=round(s.start, 4), end_h=round(s.end, 4))
                for s in plan.slots
            ],
            "night_h": round(plan.night, 4),
            "lower_bound_h": round(plan.lower_bound, 4),
            "search": plan.search,
            "unplanned": [*unprojected, *plan.unplaced],
            "drawn_at": now,
        })  # fmt: skip
        if last is not None and _news(last[0], basis):  # not only its own launches since the last drawing
            message = (f"plan redrawn: {len(runs)} queued, {len(mine)} running on {sum(nodes.values())} GPUs; "
                       f"{redrawn.last_line()} from now")
            session.add(Event(grid_id=grid.id, kind="grid.replanned", message=message,
                              data={"night_h": redrawn.night_h, "lower_bound_h": redrawn.lower_bound_h}))
            log.info("grid %s: %s", grid.id, message)
        self._drawn[grid.id] = (basis, redrawn)
        grid.plan = redrawn.model_dump(mode="json")
        return redrawn


def _news(before: tuple, after: tuple) -> bool:  # type: ignore[type-arg]
    """A run ended or left the queue, or was re-queued, or a node joined or left: what a redraw is worth
    an event for (a queued run starting as planned is not)."""
    (queued0, held0, nodes0), (queued1, held1, nodes1) = before, after
    gone = (queued0 | held0) - (queued1 | held1)  # ended, or stopped before it started
    return nodes0 != nodes1 or bool(gone) or bool(queued1 - queued0)


def _name(run: Run) -> str:
    return run_name(run.arm, run.seed, run.grid.seeds)


def run_choices(run: Run, plan: PlanPublic, largest: int) -> tuple[int, ...]:
    """The GPU counts a queued run may take: those its batch divides into when its arm is the plan's to
    size and it never started; else the count it has."""
    spec = ArmSpec.model_validate(run.spec)
    started = run.retries > 0 or run.last_checkpoint_step is not None
    if run.arm not in plan.moldable or started:
        return (spec.gpu_count(),)
    return tuple(g for g in gpu_choices(largest) if splits(spec, g))


def _elapsed_h(run: Run, now: datetime) -> float:
    return max((aware(now) - aware(run.started_at)).total_seconds() / 3600, 0.0) if run.started_at else 0.0


def remaining_hours(run: Run, gpus: int, now: datetime) -> float:
    """A live run's projected hours left on `gpus` GPUs; 0 once past its projection.

    Once it has a record, from its own progress: the steps left at its last window's rate (scaled from the
    GPUs that record ran on), an evaluation per checkpoint left at its last evaluation's time, less the time
    since that record. Before it, from the plan: its fixed hours plus its single-GPU hours over the speedup
    (the grid's plan, else the FLOP estimate without the fixed part), less the time it has run. The plan's
    projection of a short run is far off (on two H200s a run projected 74 s from its end had 150 s left),
    and a growth judged on it is wrongly declined."""
    plan = run.grid.plan or {}
    scaling = plan_scaling(plan)
    measured = _from_progress(run, gpus, now, scaling)
    if measured is not None:
        return measured
    hours = planned_hours(run)
    if hours is None:
        return 0.0
    fixed = (plan.get("fixed_h") or {}).get(run.arm, 0.0)
    return max(fixed + hours / speedup(gpus, scaling) - _elapsed_h(run, now), 0.0)


def planned_hours(run: Run) -> float | None:
    """The run's single-GPU hours of training as planned: its grid's plan, else the FLOP estimate; None for
    a command arm outside a plan (its model is the researcher's)."""
    hours = ((run.grid.plan or {}).get("hours") or {}).get(run.arm)
    if hours is None:
        spec = ArmSpec.model_validate(run.spec)
        hours = projected_gpu_hours(spec) if spec.command is None else None
    return float(hours) if isinstance(hours, int | float) and math.isfinite(hours) and hours > 0 else None


@dataclass(frozen=True)
class Expected:
    """The rate a run's plan expects on some GPUs (it/s), and how far off it a claim may be either way."""

    rate: float
    span: float


def expected_rate(run: Run, steps: int, ranks: int, scaling: Mapping[int, float]) -> Expected | None:
    """What the plan expects of the run on `ranks` GPUs: its steps over its planned hours there; a span of
    RATE_SPAN where those hours were measured or given, ESTIMATE_SPAN where they are the FLOP estimate."""
    hours = planned_hours(run)
    if hours is None:
        return None
    source = ((run.grid.plan or {}).get("sources") or {}).get(run.arm)
    span = RATE_SPAN if source in (MEASURED, GIVEN) else ESTIMATE_SPAN
    return Expected(steps / (hours * 3600 / speedup(ranks, scaling)), span)


def rate_refusal(rate: float, expected: Expected | None) -> str | None:
    """Why a record's rate (it/s) may not project its run: not a positive finite number, no planned rate to
    check it against (a command arm), or past the expected rate's span either way. None where it may."""
    if not (math.isfinite(rate) and rate > 0):
        return f"a rate of {rate:g} it/s is no rate"
    if expected is None:
        return f"a rate of {rate:g} it/s with no planned rate to check it against"
    if not expected.rate / expected.span <= rate <= expected.rate * expected.span:
        return (f"a rate of {rate:.3g} it/s is more than {expected.span:g}x off the planned "
                f"{expected.rate:.3g} it/s")  # fmt: skip
    return None


def _from_progress(run: Run, gpus: int, now: datetime, scaling: Mapping[int, float]) -> float | None:
    """The hours left from the run's last record (see remaining_hours); None without a record with a rate."""
    session = object_session(run)
    schedule = run.spec.get("schedule") or {}
    steps, every = schedule.get("steps"), schedule.get("checkpoint_every")
    if session is None or not isinstance(steps, int) or not isinstance(every, int) or every < 1:
        return None
    last = session.scalars(
        select(Metric).where(Metric.run_id == run.id, Metric.iter_per_sec > 0).order_by(Metric.step.desc()).limit(1)
    ).first()
    if last is None or last.iter_per_sec is None:
        return None
    extra = last.extra or {}
    ranks = extra.get("ranks") if isinstance(extra.get("ranks"), int) else run.spec.get("gpus") or 1
    ranks = max(ranks, 1)
    expected = expected_rate(run, steps, ranks, scaling)
    refusal = rate_refusal(last.iter_per_sec, expected)
    if refusal is not None:  # a node's claim the controller cannot check: the plan's projection stands
        _claim_refused(session, run, last, refusal)
        return None
    rate = last.iter_per_sec * speedup(gpus, scaling) / speedup(ranks, scaling)
    # Its evaluation time: a claim too, so at most the span times the planned training time between two
    # checkpoints (an evaluation of 256 images on a 200-step run took about as long as the steps).
    eval_s = min(evaluation_s(extra), expected.span * every / expected.rate)  # type: ignore[union-attr]
    left = max(steps - last.step, 0)
    since_h = max((aware(now) - aware(last.created_at)).total_seconds() / 3600, 0.0)
    claimed = max((left / rate + math.ceil(left / every) * eval_s) / 3600 - since_h, 0.0)
    # At most what the controller saw: a rate in the span may still be 1e5x below the run's real pace.
    seen = observed_hours_left(session, run, steps, now)
    if seen is not None and seen < claimed:
        _claim_said(session, run, last, CLAIM_BOUNDED,
                    f"its claim projects {claimed:.3g} h left, the pace the controller saw {seen:.3g} h")
        return seen
    # At least about what the controller saw between the node's records: a rate in the span may be 1e5x
    # above the run's real pace, and its GPUs then look free now.
    paced = paced_hours_left(session, run, steps, now)
    if paced is not None and claimed * PACE_SPAN < paced:
        paced = min(paced, seen) if seen is not None else paced
        _claim_said(session, run, last, CLAIM_BOUNDED, f"its claim projects {claimed:.3g} h left, more than "
                    f"{PACE_SPAN:g}x faster than the pace the controller saw between its records ({paced:.3g} h)")
        return paced
    return claimed


def _claim_refused(session: Session, run: Run, last: Metric, why: str) -> None:
    """The event that says a record's rate was not believed (the plan's projection kept)."""
    _claim_said(session, run, last, CLAIM_REFUSED, f"{why}; its hours left are projected from the plan")


def _claim_said(session: Session, run: Run, last: Metric, kind: str, why: str) -> None:
    """The event of `kind` that says how a record's claim was taken, once per record (each pass asks again)."""
    said = session.scalars(select(Event.data).where(Event.run_id == run.id, Event.kind == kind)).all()
    if any((d or {}).get("step") == last.step for d in said):
        return
    session.add(Event(run_id=run.id, grid_id=run.grid_id, kind=kind, data={"step": last.step},
                      message=f"step {last.step}: {why}"))  # fmt: skip
    log.info("run %s: %s", run.id, why)


def plan_scaling(plan: Mapping[str, Any]) -> dict[int, float]:
    """A stored plan's speedups by GPU count (its JSON keys are text)."""
    return {int(g): s for g, s in (plan.get("scaling") or {}).items()}


def evaluation_s(extra: Mapping[str, Any] | None) -> float:
    """A record's evaluation time in seconds: a node's claim, so 0 unless a non-negative number."""
    value = (extra or {}).get("eval_time_s")
    return float(value) if isinstance(value, int | float) and value >= 0 else 0.0


def resize(run: Run, gpus: int) -> None:
    """A queued run's spec at the GPU count its plan gives it (never a started run's: see run_choices)."""
    if run.state == RunState.queued and run.spec.get("gpus") != gpus:
        run.spec = {**run.spec, "gpus": gpus}

