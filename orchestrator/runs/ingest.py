"""Metric records into the DB, and the collapse detector on each new checkpoint.

Every record a worker yields is inserted with ON CONFLICT (run_id, step) DO NOTHING, in the same
transaction as its `checkpoint` event and the run's bookkeeping (last and best checkpoint), so a
re-sent record (a restart, a retry) changes nothing. Pure DB work, no Ray: the launcher, the
benchmarks and the tests call it alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from model.extractors.registry import labels_for_metric
from model.spec import REFERENCE_SUFFIX, STANDIN, DetectorPolicy
from orchestrator.db.events import record_event
from orchestrator.db.models import METRIC_FIELDS, Event, Grid, Metric, Run, utcnow
from orchestrator.numbers import is_finite, json_safe
from orchestrator.runs.checkpoint import EXTRACTOR_SUFFIX
from orchestrator.runs.detector import (
    Checkpoint,
    ControlBests,
    Decision,
    Series,
    judge,
    resolve_policy,
)
from orchestrator.runs.in_training import split_off
from orchestrator.runs.metric_ranges import ANY_METRIC_BOUND, out_of_range, overflowed
from orchestrator.runs.trust import untrusted_control
from orchestrator.vocabulary import STOP_DECISIONS, RunDecision
from worker.protocol import NONFINITE_TEXT, SAMPLES_SUFFIX  # how a node writes non-finite floats, per-sample lists

# Bind parameters per INSERT: below SQLite's default limit (32766 since 3.32) and Postgres' (65535).
MAX_BIND_PARAMS = 30_000
# A record's fallback notes (what the trainer did instead of what was asked: a few per run).
MAX_FALLBACKS = 64
MAX_FALLBACK_CHARS = 500
FLOAT_FIELDS = frozenset(
    c.name for c in Metric.__table__.columns if c.name in METRIC_FIELDS and c.type.python_type is float
)
INT_FIELDS = frozenset(
    c.name for c in Metric.__table__.columns if c.name in METRIC_FIELDS and c.type.python_type is int
)


def _number(value: Any, kind: type) -> Any:
    """A record value for a numeric column; the worker writes non-finite floats as strings."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if kind is int:
        return int(value) if isinstance(value, int | float) and is_finite(value) else None
    return overflowed(float(value))


def _refused_number(name: str, value: Any) -> str | None:
    """Why `value` cannot be metric `name`, or None: a number (a non-finite one, or its text, means
    diverged) within the metric's range."""
    if value is None or (isinstance(value, str) and value in NONFINITE_TEXT):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{name} {str(value)[:40]!r} is not a number"
    if name in INT_FIELDS and not isinstance(value, int):
        return f"{name} {value!r} is not an integer"
    if isinstance(value, int) and abs(value) > ANY_METRIC_BOUND:  # also past what a float holds
        return f"{name} is an integer of {len(str(abs(value)))} digits"
    return out_of_range(name, float(value))


def _list_metric(key: str) -> str | None:
    """The metric whose range a list field's values take: `<metric>_samples`, `<mmd>_per_reference`, and the flow
    loss's grid and per-timestep means (their shapes are the protocol's: worker/protocol.py CheckpointRecord)."""
    if key in ("val_flow_loss_grid", "val_flow_loss_by_t"):
        return "val_flow_loss"
    if key.endswith(REFERENCE_SUFFIX):  # an MMD's per-reference values: pseudo-values of the same range
        return key.removesuffix(REFERENCE_SUFFIX)
    return key.removesuffix(SAMPLES_SUFFIX) if key.endswith(SAMPLES_SUFFIX) else None


def _refused_list(key: str, values: Any) -> str | None:
    """Why an item of list field `key` cannot be a value of its metric, or None."""
    metric = _list_metric(key)
    if metric is None or not isinstance(values, list):
        return None
    rows = values if key == "val_flow_loss_grid" else [values]
    for row in rows:
        for i, value in enumerate(row if isinstance(row, list) else [row]):
            if why := _refused_number(metric, value):
                return f"{key} holding {why} (item {i})"
    return None


def _refused_label(key: str, label: Any) -> str | None:
    """Why `label` cannot be the extractor label `key` (`<metric>_extractor`), or None: it must be one the
    extractor registry gives that metric (a real network's or a stand-in's), never free node text that a report
    prints and whose missing "stand-in" would have random features judged as real."""
    if label is None:
        return None
    metric = key.removesuffix(EXTRACTOR_SUFFIX)
    known = labels_for_metric(metric)
    if not known:
        return f"{key}: {metric[:40]!r} is no distribution metric of the extractor registry"
    if label in known:
        return None
    long = isinstance(label, str) and len(label) > 40
    shown = f"{label[:40]!r}... ({len(label)} characters)" if long else repr(label)
    return f"{key} {shown}: not a label of {metric}'s extractors ({'; '.join(known)})"


def refused_metrics(records: list[dict[str, Any]]) -> str | None:
    """Why a worker's records cannot be stored, or None. Every metric column, every other number and every
    value of a per-sample or per-timestep list is checked against its range (runs/metric_ranges.py), every
    extractor label against the registry, and fallback notes are a short list of short strings. Linear in the
    records' size."""
    for record in records:
        step = record.get("step")
        for key, value in record.items():
            if key.endswith(EXTRACTOR_SUFFIX) and (why := _refused_label(key, value)):
                return f"a record of step {step} with {why}"
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            if (key in FLOAT_FIELDS or key in INT_FIELDS or numeric) and (why := _refused_number(key, value)):
                return f"a record of step {step} with {why}"
            if why := _refused_list(key, value):
                return f"a record of step {step} with {why}"
        notes = record.get("fallbacks")
        if notes is not None and (
            not isinstance(notes, list)
            or len(notes) > MAX_FALLBACKS
            or not all(isinstance(n, str) and len(n) <= MAX_FALLBACK_CHARS for n in notes)
        ):
            return (f"a record of step {step} whose fallbacks are not a list of at most {MAX_FALLBACKS} "
                    f"strings of {MAX_FALLBACK_CHARS} characters")
    return None


def _kept(value: Any) -> Any:
    """A value as `extra` keeps it: a float past the overflow bound as inf and a non-finite one as its text
    ("nan", "inf"), inside lists too (a diverged arm's per-sample losses)."""
    if isinstance(value, list):
        return [_kept(v) for v in value]
    return json_safe(overflowed(value) if isinstance(value, float) else value)


def metric_values(record: dict[str, Any]) -> dict[str, Any]:
    """Column values of a Metric row from a worker record; everything else goes to `extra`.

    Non-finite floats are kept in extra["nonfinite"] too, because SQLite stores NaN as NULL and the
    detector must still see a NaN loss as `diverged`.
    """
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    nonfinite: dict[str, str] = {}
    for key, value in record.items():
        if key == "step":
            continue
        if key in FLOAT_FIELDS:
            values[key] = _number(value, float)
            if values[key] is not None and not is_finite(values[key]):
                nonfinite[key] = json_safe(values[key])
        elif key in INT_FIELDS:
            values[key] = _number(value, int)
        elif key in METRIC_FIELDS:
            values[key] = None if value is None else str(value)
        else:  # a non-finite float as "nan"/"inf": metric_series reads it back
            extra[key] = _kept(value)
    if nonfinite:
        extra["nonfinite"] = nonfinite
    values["extra"] = extra
    return values


def insert_metrics(session: Session, run_id: int, records: list[dict[str, Any]]) -> set[int]:
    """INSERT ... ON CONFLICT (run_id, step) DO NOTHING for a batch, in chunks under the bind-parameter
    limit, in the caller's transaction; returns the steps that were new."""
    if not records:
        return set()
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    elif dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:  # pragma: no cover - settings only accept the two
        raise RuntimeError(f"unsupported database dialect {dialect!r}")
    now = utcnow()
    blank = dict.fromkeys(METRIC_FIELDS)  # a multi-row VALUES needs the same columns in every row
    rows = [
        {"run_id": run_id, "step": int(r["step"]), "created_at": now, **blank, **metric_values(r)} for r in records
    ]
    # Core insert into the table (not the ORM entity), and RETURNING gives back only the rows that went
    # in (rowcount is unreliable for this through the ORM). One statement per chunk: a multi-row VALUES
    # binds one parameter per column and row, and past the driver's limit (SQLite 32766) every attempt
    # of a large batch would fail, and with it every launcher pass.
    per_statement = max(1, MAX_BIND_PARAMS // len(rows[0]))
    new: set[int] = set()
    for start in range(0, len(rows), per_statement):
        stmt = (
            insert(Metric.__table__)
            .values(rows[start : start + per_statement])
            .on_conflict_do_nothing(index_elements=["run_id", "step"])
            .returning(Metric.__table__.c.step)
        )
        new.update(session.execute(stmt).scalars())
    return new


def metric_series(session: Session, run_id: int) -> list[dict[str, Any]]:
    """A run's checkpoints in step order as plain dicts (the detector's input), NaN restored. Numbers kept
    in `extra` come along (a command arm's metrics have no columns of their own, nor do the distribution
    metrics), and each distribution metric's extractor label."""
    rows = session.scalars(select(Metric).where(Metric.run_id == run_id).order_by(Metric.step)).all()
    series = []
    for m in rows:
        point: dict[str, Any] = {"step": m.step, **{name: getattr(m, name) for name in METRIC_FIELDS}}
        for key, value in (m.extra or {}).items():
            if key in point:
                continue
            if isinstance(value, int | float) and not isinstance(value, bool):
                point[key] = value
            elif value in NONFINITE_TEXT:  # a command arm's own metric gone NaN
                point[key] = float(value)
            elif key.endswith(EXTRACTOR_SUFFIX) and isinstance(value, str):  # a stand-in's metric never stops a run
                point[key] = value
        kept = (m.extra or {}).get("nonfinite")
        for key, text in kept.items() if isinstance(kept, dict) else ():
            if key in FLOAT_FIELDS and text in NONFINITE_TEXT:  # only what metric_values wrote there
                point[key] = float(text)
        series.append(point)
    return series


def last_step(session: Session, run_id: int) -> int | None:
    return session.scalar(select(func.max(Metric.step)).where(Metric.run_id == run_id))


@dataclass
class Judging:
    """The detector's bookkeeping across one batch of a run's checkpoints: the series fed so far, the
    control arm's bests, and the warnings last recorded (read from the DB once, then kept here)."""

    series: Series
    control: ControlBests | None
    total_steps: int | None
    warnings: list[str] | None = None  # None: not read yet

    def recorded(self, verdict: Decision) -> None:
        """A `warning` or `decision` event carrying the verdict's warnings was recorded."""
        self.warnings = list(verdict.warnings)


def _record_warnings(session: Session, run: Run, verdict: Decision, judging: Judging) -> None:
    """Secondary-metric warnings (they never stop a run) as a `warning` event whenever they change,
    so the dashboard shows them while the run goes on."""
    if judging.warnings is None:
        last = session.scalar(
            select(Event)
            .where(Event.run_id == run.id, Event.kind.in_(("warning", "decision")))
            .order_by(Event.id.desc())
            .limit(1)
        )
        judging.warnings = list((last.data or {}).get("warnings") or []) if last else []
    if list(verdict.warnings) != judging.warnings:
        message = "; ".join(verdict.warnings) if verdict.warnings else "warnings cleared"
        record_event(session, run, "warning", message, **verdict.to_dict())
        judging.recorded(verdict)


def _control_bests(session: Session, run: Run) -> ControlBests | None:
    """The control's bests for the stall rule, marked untrusted where its node may not stop this run
    (runs/trust.py); None without a control."""
    grid = session.get(Grid, run.grid_id)
    if grid is None or not grid.control_arm or grid.control_arm == run.arm:
        return None
    # The control's replicate of the same training seed: seeds pair, as in the report's effects.
    control = session.scalar(
        select(Run).where(Run.grid_id == run.grid_id, Run.arm == grid.control_arm, Run.seed == run.seed)
    )
    if control is None:
        return None
    points = [Checkpoint.from_mapping(p) for p in metric_series(session, control.id)]
    return ControlBests(points, untrusted_control(session, run, control)) if points else None


def _kept_checkpoint(record: dict[str, Any]) -> str | None:
    """The file that keeps this checkpoint: the trainer's best.pt when the record is its best (periodic
    files are pruned), else the periodic file."""
    if record.get("best_checkpoint") and record.get("best_step") == record.get("step"):
        return str(record["best_checkpoint"])
    return record.get("checkpoint")


def _update_best(run: Run, record: dict[str, Any], metric: str, direction: str) -> None:
    value = _number(record.get(metric), float)
    if not is_finite(value):
        return
    better = run.best_value is None or (value < run.best_value if direction == "min" else value > run.best_value)
    if better:
        run.best_value, run.best_step = value, int(record["step"])
        run.best_checkpoint = _kept_checkpoint(record)


def _checkpoint_at(session: Session, run_id: int, step: int | None) -> str | None:
    if step is None:
        return None
    extra = session.scalar(select(Metric.extra).where(Metric.run_id == run_id, Metric.step == step))
    return _kept_checkpoint({"step": step, **(extra or {})})


def _policy(run: Run) -> DetectorPolicy:
    return DetectorPolicy.model_validate((run.spec or {}).get("detector") or {})


def judging_for(session: Session, run: Run) -> Judging:
    """The detector's bookkeeping for the run, nothing fed yet: its control's series read from the DB."""
    total_steps = ((run.spec or {}).get("schedule") or {}).get("steps")
    return Judging(Series(), _control_bests(session, run), total_steps)


def apply_detector(session: Session, run: Run, judging: Judging | None = None) -> str | None:
    """Judge the run's newest checkpoint; returns the decision when it stops the run.

    `judging`: the run's series fed up to the checkpoint judged, and the control's bests; read from the
    DB when not given. A stop verdict is stored on the run (decision, step, reason; best step, value and
    checkpoint) and as a `decision` event; the caller then asks the worker for a graceful stop. In `warn`
    mode the first flag is recorded as a `warning` event and the run goes on.
    """
    policy = _policy(run)
    if policy.mode == "off":
        return None
    if judging is None:
        judging = judging_for(session, run)
        for point in metric_series(session, run.id):
            judging.series.add(Checkpoint.from_mapping(point))
    verdict = judge(judging.series, policy, judging.control, judging.total_steps)
    if not verdict.flagged:
        _record_warnings(session, run, verdict, judging)
        return None
    decision = verdict.kind.value
    if not verdict.stop:
        if run.decision is None:  # warn mode: flag once, the run goes on
            run.decision, run.decision_step = RunDecision.warning(verdict.kind), verdict.step
            run.decision_reason = verdict.reason
            record_event(session, run, "warning", verdict.reason, **verdict.to_dict())
            judging.recorded(verdict)
        return None
    run.decision, run.decision_step, run.decision_reason = decision, verdict.step, verdict.reason
    if verdict.best_step is not None:
        run.best_step, run.best_value = verdict.best_step, verdict.best_value
        run.best_checkpoint = _checkpoint_at(session, run.id, verdict.best_step) or run.best_checkpoint
    record_event(
        session,
        run,
        "decision",
        f"{decision} at step {verdict.step}: {verdict.reason}",
        **verdict.to_dict(),
        best_checkpoint=run.best_checkpoint,
    )
    judging.recorded(verdict)
    return decision


def ingest(session: Session, run: Run, records: list[dict[str, Any]], detect: bool = True) -> list[int]:
    """Store a worker's records (idempotent, one INSERT per batch); returns the steps that were new.

    Each new checkpoint, in step order, gets a `checkpoint` event, advances the run's best (the
    policy's metric and direction) and is judged by the detector unless the run is already stopping. A final
    record's in-training evaluation is never part of it (the launcher stores it: runs/in_training_store.py).
    """
    records, _ = split_off(records)  # an in-training evaluation: a job's result (runs/in_training_store.py)
    by_step = {int(r["step"]): r for r in records}
    new = insert_metrics(session, run.id, list(by_step.values()))
    if not new:
        return []
    policy = _policy(run)
    judged = detect and policy.mode != "off"
    # The series as stored (NaN restored), read once per batch and fed to the detector up to each new step.
    stored = [Checkpoint.from_mapping(p) for p in metric_series(session, run.id)] if judged else []
    judging = judging_for(session, run) if judged else None
    fed = 0
    for step in sorted(new):
        record = by_step[step]
        run.last_checkpoint_step = max(step, run.last_checkpoint_step or step)
        # the metric the detector judges this checkpoint on ("auto": the flow loss under stand-in LPIPS)
        metric = resolve_policy(policy, record.get("lpips_backbone") == STANDIN).metric
        if run.decision not in STOP_DECISIONS:
            _update_best(run, record, metric, policy.metric_mode)
        notes = [n for n in dict.fromkeys(record.get("fallbacks") or []) if n not in (run.fallbacks or [])]
        if notes and len(run.fallbacks or []) < MAX_FALLBACKS:  # a few per run: the first MAX_FALLBACKS kept
            run.fallbacks = [*(run.fallbacks or []), *notes][:MAX_FALLBACKS]
        if record.get("device_name") and not run.gpu_name:
            run.gpu_name = str(record["device_name"])[:128]
        record_event(session, run, "checkpoint", f"step {step}", step=step, **{metric: record.get(metric)})
        if judging is not None:
            while fed < len(stored) and stored[fed].step <= step:
                judging.series.add(stored[fed])
                fed += 1
            if not run.being_stopped:
                apply_detector(session, run, judging)
    return sorted(new)
