"""Writing reports to disk: on demand (`ablate report`), when a grid ends (`ReportWriter`, a listener of
the launcher, asks every housekeeping pass: write_due_reports) and into a sweep's copied-back results.

A grid is due when all its runs are in a terminal state and no `report.written` or `report.failed`
event names it: each grid gets its report once, whichever way it ended (finished, stopped while
queued, failed after retries, or found ended by a restarted controller). It waits for the grid's evaluations
that are queued or running, among them the distribution pass at the best checkpoints that a grid measuring
distribution metrics gets first (results/best_distribution.py).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sqlalchemy import exists, select
from sqlalchemy.orm import Session

from orchestrator.db.models import Evaluation, Event, Grid, Run
from orchestrator.db.session import session_scope
from orchestrator.results.best_distribution import queue_best_pass
from orchestrator.results.deciding.decider import decision_pending
from orchestrator.results.pass_listener import PassListener
from orchestrator.results.reports.build import build_report
from orchestrator.results.reports.model import GridReport
from orchestrator.results.reports.render import RENDERERS
from orchestrator.results.reports.tracker_table import record_effects, record_look_effects
from orchestrator.settings import Settings
from orchestrator.vocabulary import TERMINAL_STATES, EvaluationState

log = logging.getLogger(__name__)
REPORT_EVENTS = ("report.written", "report.failed")
EVALUATION_ENDED = (EvaluationState.completed, EvaluationState.failed)


def report_dir(settings: Settings, grid_id: int) -> Path:
    """Where a grid's report is written when it ends: home_dir/reports/grid-{id}."""
    return settings.home_dir / "reports" / f"grid-{grid_id}"


def write_report(session: Session, grid: Grid, out: Path, storage_options: dict[str, Any] | None = None) -> list[Path]:
    """report.json, report.md and report.html of `grid` into `out` (created); returns the paths."""
    return write_rendered(build_report(session, grid, storage_options), out)


def write_rendered(report: GridReport, out: Path) -> list[Path]:
    return write_texts({ext: render(report) for ext, render in RENDERERS.items()}, out)


def write_texts(texts: dict[str, str], out: Path) -> list[Path]:
    """Each rendered report (format -> text) as out/report.{format}, `out` created; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext, text in texts.items():
        path = out / f"report.{ext}"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)  # a reader never sees half a report
        paths.append(path)
    return paths


def due_grids(session: Session) -> list[int]:
    """Grids with runs, none of them still active nor any of their evaluations, and no report event yet (a
    deciding grid: once its decision has ended, results/deciding/decider.py)."""
    active = exists().where(Run.grid_id == Grid.id, Run.state.not_in(TERMINAL_STATES))
    evaluating = exists().where(Evaluation.grid_id == Grid.id, Evaluation.state.not_in(EVALUATION_ENDED))
    has_runs = exists().where(Run.grid_id == Grid.id)
    reported = exists().where(Event.grid_id == Grid.id, Event.run_id.is_(None), Event.kind.in_(REPORT_EVENTS))
    grids = session.scalars(select(Grid).where(has_runs, ~active, ~evaluating, ~reported).order_by(Grid.id))
    return [g.id for g in grids if not decision_pending(session, g)]  # a deciding grid: after its last look


def write_due_reports(settings: Settings) -> list[int]:
    """Write the report of every grid that has ended since the last pass; returns their ids. A failure is
    recorded as a `report.failed` event (no retry every tick; `ablate report` writes it by hand)."""
    with session_scope(settings.database_url) as session:
        due = due_grids(session)
    written = []
    for grid_id in due:
        out = report_dir(settings, grid_id)
        with session_scope(settings.database_url) as session:
            grid = session.get(Grid, grid_id)
            if grid is None:
                continue
            try:
                if queue_best_pass(session, grid) is not None:
                    continue  # the report once the pass at the best checkpoints has ended
                report = build_report(session, grid, settings.checkpoint_options)
                write_rendered(report, out)
            except Exception as exc:  # noqa: BLE001 - a report must never stop the launcher
                log.exception("report of grid %s failed", grid_id)
                session.add(Event(grid_id=grid_id, kind="report.failed",
                                  message=f"report not written: {type(exc).__name__}: {exc} "
                                          f"(write it with `ablate report {grid_id}`)"))  # fmt: skip
                continue
            session.add(Event(grid_id=grid_id, kind="report.written", message=f"report written to {out}",
                              data={"dir": str(out)}))  # fmt: skip
            record_effects(session, grid, report.effects, final=True)  # the trackers' table (tracker_table.py)
            written.append(grid_id)
    return written


class ReportWriter(PassListener):
    """The launcher's listener that writes a grid's report when the grid ends (runs/launcher.py
    `LoopListener`); it works in the loop's housekeeping pass, which a failed report never stops."""

    def housekeeping(self) -> None:
        write_due_reports(self.settings)
        record_look_effects(self.settings)  # a deciding grid's trackers see each look's decisions
