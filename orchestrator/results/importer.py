"""Import published per-checkpoint curves (the fixture's schema, read by orchestrator.results.curves) as a
finished grid, so a past study shows on the dashboard next to new ones, with the collapse
detector's decisions replayed over it.

Each curve becomes one run of the arm it names (the letter in `A_baseline`, or an explicit
mapping), with its spec resolved from arms/; every checkpoint becomes a Metric row. The study ran
every arm to the end, so all checkpoints are kept; an arm the detector would have stopped is
stored as `stopped` at the detector's step, with its reason and best checkpoint.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from model.spec import DISTRIBUTION_METRICS, ArmSpec, DetectorPolicy
from orchestrator.db.models import Event, Grid, Run
from orchestrator.grids.arms import arm_files
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.results.curves import Curve
from orchestrator.runs.checkpoint import EXTRACTOR_SUFFIX
from orchestrator.runs.detector import ReplayResult, replay
from orchestrator.runs.ingest import insert_metrics
from orchestrator.spreadsheet_text import csv_safe
from orchestrator.vocabulary import GridSource, RunState

# Fixture keys with a DB column of another name. elapsed_hours: one arm holds one GPU, so the
# wall-clock hours since the arm started are its GPU-hours.
RENAMED = {"elapsed_hours": "gpu_hours", "num_recon_samples": "recon_lpips_n", "num_text_samples": "text_lpips_n"}
_LETTER = re.compile(r"^([A-Z])(?:$|[_\-\s.:])")


class CurvesImportError(ValueError):
    """Curves that cannot be imported as a grid; the message names the arm and the fix."""


def arm_letter(key: str, label: str, arm_map: Mapping[str, str]) -> str:
    """The arms/ letter a curve belongs to: an explicit mapping first, else the leading letter of
    its key or label (`A_baseline` -> A)."""
    known = arm_files()
    if key in arm_map or label in arm_map:
        letter = arm_map.get(key, arm_map.get(label, ""))
        if letter not in known:
            known_list = ", ".join(sorted(known))
            raise CurvesImportError(f"--arm {key}={letter}: unknown arm {letter!r}; known arms: {known_list}")
        return letter
    for text in (key, label):
        m = _LETTER.match(text)
        if m and m.group(1) in known:
            return m.group(1)
    raise CurvesImportError(
        f"curve {key!r}: cannot tell which arm of arms/ it is; name it like 'A_baseline' or pass --arm {key}=A"
    )


def arm_letters(curves: Mapping[str, Curve], arm_map: Mapping[str, str]) -> dict[str, str]:
    """Curve key -> arm letter for every curve; each arm at most once (CurvesImportError otherwise)."""
    letters = {key: arm_letter(key, c.label, arm_map) for key, c in curves.items()}
    seen: dict[str, str] = {}
    for key, letter in letters.items():
        if letter in seen:
            raise CurvesImportError(
                f"curves {seen[letter]!r} and {key!r} are both arm {letter}; map one with --arm KEY=LETTER"
            )
        seen[letter] = key
    return letters


# The extractor label of a distribution metric that came in with published curves: whatever network the study
# used, it was its own (never ablate's stand-in), and the report says where the number came from.
IMPORTED_EXTRACTOR = "as published (imported)"


def _record(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A fixture checkpoint as a worker record: fixture keys renamed to their DB columns, each distribution
    metric labelled with its extractor where the curves name none. A key or text value a spreadsheet would
    run (`=HYPERLINK(...)` as a column's name) is made inert: it becomes a tracker's chart name and a cell of
    the trackers' and the dashboard's CSV exports."""
    record = {csv_safe(key): csv_safe(value) for key, value in raw.items()}
    for key, column in RENAMED.items():
        if key in record and column not in record:
            record[column] = record.pop(key)
    for metric in DISTRIBUTION_METRICS:
        if record.get(metric) is not None:
            record.setdefault(f"{metric}{EXTRACTOR_SUFFIX}", IMPORTED_EXTRACTOR)
    return record


def _parse_time(text: Any) -> datetime | None:
    """ISO timestamps in the fixture carry no zone; they are taken as UTC."""
    if not isinstance(text, str):
        return None
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _apply(run: Run, curve: Curve, result: ReplayResult, start: datetime | None) -> Event:
    """Store the replayed verdict on the run; returns the decision event."""
    final = result.decision
    last = result.decisions[-1]
    run.state = RunState.stopped if result.stopped else RunState.completed
    run.decision = final.kind.value
    run.decision_step = final.step
    run.decision_reason = final.reason
    # Best checkpoint up to where the arm ran under the detector (the one it would have kept).
    run.best_step, run.best_value = last.best_step, last.best_value
    run.last_checkpoint_step = curve.checkpoints[-1].step
    run.started_at = start
    end_hours = curve.checkpoints[-1].hours
    end_time = _parse_time(curve.raw[-1].get("wall_time_iso"))
    run.finished_at = end_time or (start + timedelta(hours=end_hours) if start and end_hours is not None else None)
    ran_on = curve.checkpoints[-1].step
    note = (
        f" (replayed on import; the study itself ran on to step {ran_on}"
        + (f", {result.gpu_hours_saved:.1f} GPU-hours the stop would have saved)" if result.gpu_hours_saved else ")")
        if result.stopped and ran_on > final.step
        else ""
    )
    return Event(
        run_id=run.id,
        grid_id=run.grid_id,
        kind="decision",
        message=f"{final.kind.value} at step {final.step}: {final.reason}{note}",
        data={**result.to_json(), "replayed_on_import": True, "study_last_step": ran_on},
    )


def import_curves(
    session: Session,
    curves: Mapping[str, Curve],
    name: str,
    *,
    control: str | None = None,
    arm_map: Mapping[str, str] | None = None,
    policy: DetectorPolicy | None = None,
    source: str = "",
    start_times: Mapping[str, str] | None = None,
) -> Grid:
    """Store `curves` as a finished grid named `name` and replay the detector over it; flushes, no commit.

    control: a curve key or arm letter (default: the first curve). arm_map: curve key or label ->
    arm letter, for curves not named after their arm. policy: one DetectorPolicy for every arm
    (default: each arm's spec). start_times: curve key -> ISO start time (the fixture's `start_time`).
    Raises CurvesImportError or orchestrator.grids.service.GridError with a message naming the field.
    """
    letters = arm_letters(curves, arm_map or {})
    control_letter = letters.get(control, control) if control is not None else None
    grid = create_grid(
        session,
        GridCreate(name=name, arms=list(letters.values()), control=control_letter),
        source=GridSource.imported,
    )
    pairs: list[tuple[Run, Curve]] = []
    for run, (key, curve) in zip(grid.runs, curves.items(), strict=True):
        pairs.append((run, curve))
        insert_metrics(session, run.id, [_record(raw) for raw in curve.raw])
        label = csv_safe(curve.label)  # a run's name in the file: an event's text, forwarded to the trackers
        session.add(
            Event(
                run_id=run.id,
                grid_id=grid.id,
                kind="imported",
                message=f"{len(curve.raw)} checkpoints of {label!r}" + (f" from {source}" if source else ""),
                data={"key": csv_safe(key), "label": label, "source": source, "checkpoints": len(curve.raw)},
            )
        )
    # Each arm under its own spec's detector policy unless one was given; run.arm labels are unique.
    policies = {r.arm: policy if policy is not None else ArmSpec.model_validate(r.spec).detector for r, _ in pairs}
    results = replay({run.arm: curve.checkpoints for run, curve in pairs}, policies, control=grid.control_arm)
    for (run, curve), result in zip(pairs, results, strict=True):
        session.add(_apply(run, curve, result, _parse_time((start_times or {}).get(curve.arm))))
    session.flush()
    return grid


def start_times_of(data: Mapping[str, Any]) -> dict[str, str]:
    """The fixture's per-arm `start_time` (orchestrator.results.curves keeps only label and checkpoints)."""
    return {
        key: body["start_time"]
        for key, body in data.items()
        if isinstance(body, Mapping) and isinstance(body.get("start_time"), str)
    }
