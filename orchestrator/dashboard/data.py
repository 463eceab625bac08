"""What the dashboard shows, read from the DB: the grid list, one grid's series, paired differences
against the control arm, what each arm changes against its parent, and the CSV export.

Pure reads over the stored models, so the dashboard works on imported or finished grids and shows
live grids as the launcher writes them.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from model.flow_headline import HEADLINE
from model.spec import STANDIN
from orchestrator.db.models import METRIC_FIELDS, Event, Grid, Metric, Node, RentedInstance, Run, Schedule, Sweep
from orchestrator.grids.arms import LINEAGE_KEYS, ArmError, changes, flatten, resolve
from orchestrator.numbers import finite_or_none, is_finite
from orchestrator.results import evaluations as evaluation_reads
from orchestrator.results.data_feed import data_feed
from orchestrator.results.deciding.decisions import decision_json, with_decisions
from orchestrator.results.evaluations import distribution_evaluations, evaluation_warnings, largest_evaluation
from orchestrator.results.judge import best_checkpoint, judge_metric, stored_spec
from orchestrator.results.own_metrics import is_command_run, own_series
from orchestrator.results.record_lists import stored_list, unreadable_records
from orchestrator.results.reports.build import grid_effects_now
from orchestrator.results.reports.effects import metric_words
from orchestrator.results.reports.pairing import Pairing
from orchestrator.results.reports.stats import DISTRIBUTION, QUALITY, paired_difference, value_of
from orchestrator.results.samples import sample_index
from orchestrator.results.views import RunSummary, SweepPublic
from orchestrator.runs.checkpoint import EXTRACTOR_SUFFIX
from orchestrator.runs.storage import STORAGE_EVENTS, storage_alarms
from orchestrator.spreadsheet_text import csv_safe
from orchestrator.vocabulary import STOP_DECISIONS, TERMINAL_STATES, GridState, NodeState, RentedState, RunState

# Events whose data carries the detector's `warnings` (orchestrator.runs.detector.Decision.warnings).
WARNING_EVENTS = ("decision", "warning")


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t is not None else None


def grid_state(states: Iterable[str]) -> GridState:
    """One word for a grid, from its runs' states."""
    counts = Counter(states)
    if not counts:
        return GridState.empty
    if counts[RunState.running] or counts[RunState.starting]:
        return GridState.running
    if counts[RunState.queued]:
        # Some arms done, others waiting for a GPU: the grid is still going.
        return GridState.running if sum(counts[s] for s in TERMINAL_STATES) else GridState.queued
    return GridState.failed if counts[RunState.failed] else GridState.finished


def _run_gpu_hours(session: Session, run_ids: list[int]) -> dict[int, float]:
    """GPU-hours so far per run: the largest value its checkpoints reported."""
    if not run_ids:
        return {}
    rows = session.execute(
        select(Metric.run_id, func.max(Metric.gpu_hours)).where(Metric.run_id.in_(run_ids)).group_by(Metric.run_id)
    )
    return {rid: float(h) for rid, h in rows if is_finite(h)}


# Grids per page of the list: the page is polled every few seconds by every open dashboard, so its cost
# must not grow with the history (200 grids x 64 arms took 1.96 s and 865 KB unpaged).
PAGE_SIZE = 50


def grid_count(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(Grid)) or 0


def grid_rows(session: Session, limit: int = PAGE_SIZE, offset: int = 0) -> list[dict[str, Any]]:
    """One row per grid, newest first, `limit` of them from `offset`: state, arms with their states,
    started, GPU-hours."""
    grids = session.scalars(
        select(Grid).options(selectinload(Grid.runs)).order_by(Grid.id.desc()).limit(limit).offset(offset)
    ).all()
    hours = _run_gpu_hours(session, [r.id for g in grids for r in g.runs])
    rows = []
    for g in grids:
        started = [r.started_at for r in g.runs if r.started_at is not None]
        run_hours = [hours[r.id] for r in g.runs if r.id in hours]
        rows.append(
            {
                "id": g.id,
                "name": g.name,
                "source": g.source,
                "state": grid_state(r.state for r in g.runs),
                "arms": [{"arm": r.arm, "state": r.state, "decision": r.decision} for r in g.runs],
                "created_at": _iso(g.created_at),
                "started_at": _iso(min(started)) if started else None,
                "gpu_hours": round(sum(run_hours), 3) if run_hours else None,
            }
        )
    return rows


def sweep_rows(session: Session, limit: int = 20) -> list[dict[str, Any]]:
    """The latest sweeps, newest first, each node with its state: a node whose teardown failed may
    still be running and billing, so the page shows it in red."""
    nodes = {n.name: (n.state, n.state_detail) for n in session.scalars(select(Node))}
    rows = []
    for sweep, schedule in session.execute(
        select(Sweep, Schedule.name)
        .join(Schedule, Sweep.schedule_id == Schedule.id)
        .order_by(Sweep.id.desc())
        .limit(limit)
    ):
        row = SweepPublic.model_validate(sweep).model_dump(mode="json")
        row.update(
            schedule=schedule,
            nodes=[
                {"name": n, "state": nodes.get(n, ("removed", None))[0], "detail": nodes.get(n, ("", None))[1]}
                for n in sweep.nodes
            ],
        )
        rows.append(row)
    return rows


def for_anonymous(sweeps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sweep rows as a request without the API token sees them: no money and no remote output.

    Spend, budget, prices and costs say what the account pays and how much is left of it (an open page
    would tell anyone who reaches the controller what the lab spends each night, and when a budget runs
    out); /api/schedules, which carries them too, always needs the token. Errors carry the failing
    remote command and its output (hosts, paths). The page says where the details are."""
    for row in sweeps:
        where = f"with the API token: GET /api/schedules/{row['schedule']}"
        row.update(spend=None, budget=None, price_per_hour=None, money_hidden=where)
        if row["error"]:
            row["error"] = f"failed; details {where}"
        if row["stop_reason"]:  # a budget stop names the spend, the budget and the price per hour
            row["stop_reason"] = f"stopped early; the reason {where}"
        for instance in row["instances"]:
            instance.update(price_per_hour=None, cost_so_far=None)
            if instance["last_error"]:  # a failed bootstrap's reason carries command output too
                instance["last_error"] = "details with the API token"
    return sweeps


def failed_bootstraps(session: Session) -> list[dict[str, str | None]]:
    """Nodes whose last bootstrap failed, with the step and how (`join: exit 126`)."""
    rows = session.execute(
        select(Node.name, Node.state_detail).where(Node.state == NodeState.bootstrap_failed).order_by(Node.name)
    )
    return [{"name": name, "detail": detail} for name, detail in rows]


def unconfirmed_destroys(session: Session) -> list[str]:
    """Rented instances whose destroy was not confirmed: they may still bill (the reaper retries)."""
    rows = session.execute(
        select(RentedInstance.provider, RentedInstance.instance_id)
        .where(RentedInstance.state == RentedState.destroy_failed)
        .order_by(RentedInstance.id)
    )
    return [f"{provider} {iid}" for provider, iid in rows]


def unreleased_nodes(session: Session) -> list[str]:
    """Nodes whose teardown failed: they may still be running and billing."""
    return list(session.scalars(select(Node.name).where(Node.state == NodeState.teardown_failed).order_by(Node.name)))


def grid_version(session: Session, grid_id: int, alarm_minutes: float = 15.0) -> str:
    """A short token that changes whenever anything the grid page shows changes (for polling)."""
    runs = session.execute(
        select(Run.id, Run.state, Run.decision, Run.decision_step, Run.best_step, Run.fallbacks, Run.stop_requested)
        .where(Run.grid_id == grid_id)
        .order_by(Run.id)
    ).all()
    ids = [r[0] for r in runs]
    metrics = (
        session.execute(select(func.count(Metric.id), func.max(Metric.id)).where(Metric.run_id.in_(ids))).one()
        if ids
        else (0, None)
    )
    # A new decision/warning event can bring new detector warnings without changing the run row.
    flagged = (
        session.scalar(select(func.max(Event.id)).where(Event.run_id.in_(ids), Event.kind.in_(WARNING_EVENTS)))
        if ids
        else None
    )
    # Storage: a new upload event, and a checkpoint crossing the alarm time with no new event at all.
    stored = (
        session.scalar(select(func.max(Event.id)).where(Event.run_id.in_(ids), Event.kind.in_(STORAGE_EVENTS)))
        if ids
        else None
    )
    grid_runs = session.scalars(select(Run).where(Run.grid_id == grid_id)).all()
    alarms = sorted(rid for rid, a in storage_alarms(session, list(grid_runs), alarm_minutes).items() if a["alarm"])
    plan = session.scalar(select(Grid.plan).where(Grid.id == grid_id)) or {}  # redrawn by the launcher
    drawn = [plan.get("drawn_at"), plan.get("night_h")]
    jobs = evaluation_reads.job_states(session, grid_id)  # a job ended changes the effects or the warnings
    blob = json.dumps([[list(r) for r in runs], list(metrics), flagged, stored, alarms, drawn, jobs], default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def _extractors(metrics: list[Metric]) -> dict[str, str]:
    """Each distribution metric's extractor label (its latest), which says stand-in where it is one."""
    return {q: label for m in metrics for q in DISTRIBUTION
            if isinstance(label := (m.extra or {}).get(f"{q}{EXTRACTOR_SUFFIX}"), str)}  # fmt: skip


def _series(metrics: list[Metric]) -> dict[str, list[Any]]:
    cols: dict[str, list[Any]] = {"step": [m.step for m in metrics]}
    headline = (HEADLINE, f"{HEADLINE}_se")  # the flow headline, in `extra` (or from the grid): the detector's judge
    # the distribution metrics, in `extra` at the checkpoints their pass measured (None between)
    in_extra = (*headline, *(f"{q}{part}" for q in DISTRIBUTION for part in ("", "_se")))
    for name in (*METRIC_FIELDS, *in_extra):
        values = [value_of(m, name) if name in in_extra else getattr(m, name) for m in metrics]
        if any(v is not None for v in values):
            cols[name] = [finite_or_none(v) if isinstance(v, float) else v for v in values]
    return cols


def lineage(grid: Grid) -> list[dict[str, Any]]:
    """Per run: its parent and what it changes against it (orchestrator.grids.arms.changes on stored specs).

    The parent is taken from the grid when one of its runs is that arm, else resolved from arms/ with
    the grid's overrides applied (so a tiny-size grid is not compared with a seed-size parent).
    """
    by_name: dict[str, Run] = {}
    for r in grid.runs:
        by_name.setdefault(r.arm, r)
        name = (r.spec or {}).get("name")
        if isinstance(name, str):
            by_name.setdefault(name, r)
    rows = []
    for r in grid.runs:
        spec = r.spec or {}
        parent = spec.get("parent")
        row: dict[str, Any] = {
            "arm": r.arm,
            "description": spec.get("description"),
            "parent": parent,
            "parent_source": None,
            "changes": {},
            "note": None,
        }
        if not parent:
            row["note"] = "root arm (no parent)"
            rows.append(row)
            continue
        parent_raw: dict[str, Any] | None = None
        if parent in by_name:
            parent_raw, row["parent_source"] = by_name[parent].spec, "grid"
        else:
            try:
                overrides = {k: v for k, v in (grid.overrides or {}).items() if k not in LINEAGE_KEYS}
                parent_raw, row["parent_source"] = resolve(parent, overrides).model_dump(mode="json"), "arms/"
            except (ArmError, ValidationError) as exc:
                row["note"] = f"parent {parent!r} not resolvable: {exc}"
        if parent_raw is not None:
            mine, theirs = stored_spec(spec), stored_spec(parent_raw)
            if mine is not None and theirs is not None:
                row["changes"] = changes(mine, theirs)
            else:
                # A spec stored by an older schema: diff the raw fields rather than show nothing.
                strip = set(LINEAGE_KEYS)
                a = flatten({k: v for k, v in spec.items() if k not in strip})
                b = flatten({k: v for k, v in parent_raw.items() if k not in strip})
                row["changes"] = {k: v for k, v in a.items() if b.get(k) != v}
                row["note"] = "raw diff: a stored spec no longer validates against the current schema"
        rows.append(row)
    return rows


def _metrics_by_run(session: Session, run_ids: list[int]) -> dict[int, list[Metric]]:
    out: dict[int, list[Metric]] = {rid: [] for rid in run_ids}
    if run_ids:
        for m in session.scalars(select(Metric).where(Metric.run_id.in_(run_ids)).order_by(Metric.run_id, Metric.step)):
            out[m.run_id].append(m)
    return out


def latest_warnings(session: Session, run_ids: list[int]) -> dict[int, list[str]]:
    """Per run, the detector's warnings from its newest decision or warning event (e.g. a secondary
    metric worsening: the arm ran on); runs without such an event are left out."""
    out: dict[int, list[str]] = {}
    if run_ids:
        rows = session.execute(
            select(Event.run_id, Event.data)
            .where(Event.run_id.in_(run_ids), Event.kind.in_(WARNING_EVENTS))
            .order_by(Event.run_id, Event.id)
        )
        for run_id, data in rows:
            warnings = (data or {}).get("warnings")
            if isinstance(warnings, list):
                out[run_id] = [str(w) for w in warnings]  # a later event replaces an earlier one
    return out


def flow_by_t(metrics: list[Metric]) -> dict[str, Any]:
    """val_flow_loss's per-timestep means per checkpoint (drawn on demand): the times and, per step, the
    means in that order; checkpoints without them are left out."""
    t: list[float] = []
    steps, rows = [], []
    for m in metrics:
        by_t = stored_list(m.extra, "val_flow_loss_by_t")  # its declared shape, "nan" read as NaN
        if by_t:
            t = stored_list(m.extra, "val_flow_loss_t") or [(i + 0.5) / len(by_t) for i in range(len(by_t))]
            steps.append(m.step)
            rows.append([finite_or_none(x) for x in by_t])
    return {"t": t, "step": steps, "by_t": rows}


def grid_detail(session: Session, grid: Grid, alarm_minutes: float = 15.0) -> dict[str, Any]:
    """Everything the grid page draws, as JSON-ready data. alarm_minutes: a run whose newest checkpoint
    has not reached checkpoint storage for that long is flagged (settings.checkpoint_alarm_minutes)."""
    runs = list(grid.runs)
    metrics = _metrics_by_run(session, [r.id for r in runs])
    storage = storage_alarms(session, runs, alarm_minutes)
    warnings = latest_warnings(session, [r.id for r in runs])
    pairing = Pairing(grid)  # seed s of an arm against seed s of the control
    control = pairing.control(0)
    evaluation, evaluated = largest_evaluation(session, grid)  # more images, no retraining: what the effects use
    not_used = evaluation_warnings(session, grid)  # a stranger's evaluation of a run: a warning on it, not used
    skipped = evaluation_reads.skipped_jobs(session, grid)  # a diverged run's job skipped: shown, with why
    judge, effects = grid_effects_now(grid, metrics, evaluated, distribution_evaluations(session, grid)[1])
    effects = with_decisions(session, grid, effects)  # a deciding grid: each decided effect's decision
    arm_index = {arm: i for i, arm in enumerate(dict.fromkeys(r.arm for r in runs))}
    out_runs = []
    for r in runs:
        ms = metrics[r.id]
        ctrl = pairing.control(r.seed)
        standin = sorted({m.step for m in ms if m.lpips_backbone == STANDIN})
        judged = judge_metric(r, bool(standin))
        if r.best_step is not None:  # the detector's, by the metric it judges
            best_step, best_value = r.best_step, r.best_value
        else:  # nothing kept yet: the best judged value so far
            best = best_checkpoint(r, ms, judged)
            best_step, best_value = (best.step, value_of(best, judged)) if best is not None else (None, None)
        backbones = sorted({m.lpips_backbone for m in ms if m.lpips_backbone})
        row = RunSummary.from_row(r, ms[-1] if ms else None).model_dump(mode="json")  # NaN/Inf -> null
        own = own_series(ms) if is_command_run(r) else {}  # a command arm's metrics, plotted by their names
        row.update(
            label=f"{r.arm} s{r.seed}" if grid.seeds > 1 else r.arm,  # replicates: one colour, one dash per seed
            arm_index=arm_index[r.arm],
            description=(r.spec or {}).get("description"),
            stopped=r.decision in STOP_DECISIONS and r.decision_step is not None,
            best_step=best_step,
            best_value=finite_or_none(best_value),
            best_from_detector=r.best_step is not None,
            fallbacks=r.fallbacks or [],
            warnings=warnings.get(r.id, []) + not_used.get(r.id, []),
            evaluations_skipped=skipped.get(r.id, []),
            lpips_backbones=backbones,
            standin_steps=standin,
            extractors=_extractors(ms),
            judge_metric=judged,
            flow_by_t=flow_by_t(ms),
            nodes=r.nodes or [],
            storage=storage.get(r.id),
            error=r.error,
            series=_series(ms) | own,
            own_metrics=list(own),
            samples=sample_index([(m.step, m.extra) for m in ms]).model_dump(),
            data=data_feed([(m.step, m.extra) for m in ms]).model_dump(),
            paired=(
                {q: paired_difference(ms, metrics[ctrl.id], q) for q in (HEADLINE, *QUALITY, *DISTRIBUTION)}
                if ctrl is not None and r.id != ctrl.id
                else None
            ),
        )
        out_runs.append(row)
    return {
        "id": grid.id,
        "name": grid.name,
        "source": grid.source,
        "control": control.arm if control else None,
        "seeds": grid.seeds,
        "judge": judge,  # the metric the effects table leads with
        "evaluation": evaluation.model_dump(mode="json") if evaluation is not None else None,
        "effects": [{**e.model_dump(mode="json"), "words": metric_words(e.metric)} for e in effects],
        "state": grid_state(r.state for r in runs),
        "live": any(r.state not in TERMINAL_STATES for r in runs),
        "created_at": _iso(grid.created_at),
        "version": grid_version(session, grid.id, alarm_minutes),
        "runs": out_runs,
        "lineage": lineage(grid),
        # records whose per-sample or per-timestep lists were left out of the curves and effects, named
        "unreadable_records": unreadable_records([(f"run {r.id} ({r.arm}, seed {r.seed})", m.step, m.extra)
                                                  for r in runs for m in metrics[r.id]]),  # fmt: skip
        "decide": decision_json(session, grid),  # a deciding grid's looks, what is open (deciding/decisions.py)
        "plan": grid.plan,  # the night plan (orchestrator/grids/night.py PlanPublic), None without one
    }


CSV_RUN_COLUMNS = ("grid_id", "grid", "run_id", "arm", "state", "decision", "decision_step", "step")


def metrics_csv(session: Session, grid: Grid) -> str:
    """Every checkpoint of every run of the grid, one row each; `extra` as a JSON column. Text cells
    that a spreadsheet would evaluate are neutralised (csv_safe)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([*CSV_RUN_COLUMNS, *METRIC_FIELDS, "extra"])
    metrics = _metrics_by_run(session, [r.id for r in grid.runs])
    for r in grid.runs:
        for m in metrics[r.id]:
            writer.writerow(
                [
                    grid.id,
                    csv_safe(grid.name),
                    r.id,
                    csv_safe(r.arm),
                    r.state,
                    r.decision or "",
                    "" if r.decision_step is None else r.decision_step,
                    m.step,
                    *("" if getattr(m, f) is None else csv_safe(getattr(m, f)) for f in METRIC_FIELDS),
                    json.dumps(m.extra or {}, sort_keys=True),
                ]
            )
    return buf.getvalue()
