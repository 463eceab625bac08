"""A grid's effects table at a tracker: when it is due, what the sink gets, and sending it from a lane.

Due is the latest table the report writer stored (results/reports/tracker_table.py: after each look of a
deciding grid, and with the final report) that the grid's cursor (its `tracker_runs` row with no run) has
not passed. A lane of the forwarder sends it after its runs' points; a table the tracker does not take is
named on the grid once per outage (a `tracker` event) and tried again after a pause that doubles, as a
run's points are, and the grid gets "forwarded again" when it goes out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestrator.db.models import Event, Grid, Run, TrackerRun, utcnow
from orchestrator.db.session import session_scope
from orchestrator.messages import masked_text
from orchestrator.results.reports.tracker_table import COLUMNS, EFFECTS_EVENT, latest_effects
from orchestrator.results.views import hide_env
from orchestrator.settings import Settings
from orchestrator.trackers.base import (
    FIRST_RETRY_WAIT_S,
    TRACKER_EVENT,
    GridEffects,
    Sink,
    TrackedRun,
    TrackerUnavailable,
    tracked_name,
)
from orchestrator.trackers.cursor import tracker_cursor
from orchestrator.vocabulary import RunState, TrackerName

log = logging.getLogger("ablate.trackers")
Attempt = Callable[[str, Callable[[], Any]], Any]  # the lane's retrying call: (what, call) -> its result


def due_effects(session: Session, tracker: TrackerName) -> list[int]:
    """Grids naming `tracker` whose latest effects table its grid cursor has not passed, oldest first."""
    grids = [gid for gid, names in session.execute(select(Grid.id, Grid.trackers)) if tracker in (names or [])]
    if not grids:
        return []
    latest = dict(session.execute(
        select(Event.grid_id, func.max(Event.id))
        .where(Event.grid_id.in_(grids), Event.run_id.is_(None), Event.kind == EFFECTS_EVENT)
        .group_by(Event.grid_id)).all())  # fmt: skip
    seen = dict(session.execute(
        select(TrackerRun.grid_id, TrackerRun.event_id)
        .where(TrackerRun.tracker == tracker, TrackerRun.run_id.is_(None), TrackerRun.grid_id.in_(list(latest)))
    ).all())  # fmt: skip
    return sorted(gid for gid, event_id in latest.items() if event_id > (seen.get(gid) or 0))


def read_effects(session: Session, tracker: TrackerName, grid_id: int) -> tuple[int, GridEffects] | None:
    """The grid's latest effects table as `tracker`'s sink gets it, with its event id; None when it has none."""
    found = latest_effects(session, grid_id)
    grid = session.get(Grid, grid_id)
    if found is None or grid is None:
        return None
    event_id, table = found
    cursors = {c.run_id: c for c in session.scalars(select(TrackerRun).where(
        TrackerRun.tracker == tracker, TrackerRun.grid_id == grid_id))}  # fmt: skip
    group = cursors.get(None)
    runs, failed = [], set()
    for run in session.scalars(select(Run).where(Run.grid_id == grid_id).order_by(Run.id)):
        cursor = cursors.get(run.id)
        if cursor is None or cursor.external_id is None:
            continue  # never opened in this tracker: nothing to show the table in
        spec = hide_env(dict(run.spec or {}))  # what every reader sees, as forwarder.read_due sends it
        runs.append(TrackedRun(run.id, tracked_name(run.arm, run.seed, grid.seeds), grid.id, grid.name, spec,
                               cursor.external_id, group.external_id if group is not None else None))  # fmt: skip
        if run.state == RunState.failed:
            failed.add(run.id)
    return event_id, GridEffects(
        grid_id=grid.id, grid_name=grid.name, at=table.at, step=table.look or 0, columns=COLUMNS,
        rows=tuple(tuple(row.cells()) for row in table.rows),
        group_id=group.external_id if group is not None else None, runs=tuple(runs), failed=frozenset(failed),
    )  # fmt: skip


@dataclass
class EffectsSender:
    """One tracker lane's effects tables: which grids' are due, and each grid's pause after a refusal."""

    settings: Settings
    tracker: TrackerName
    retry_at: dict[int, float] = field(default_factory=dict)  # grid id -> monotonic time of its next try

    def send_due(self, sink: Callable[[], Sink], attempt: Attempt, halted: Callable[[], bool]) -> None:
        """Send every due table: `sink` gives the lane's sink (built on first use), `attempt` retries a call."""
        with session_scope(self.settings.database_url) as session:
            due = due_effects(session, self.tracker)
        now = time.monotonic()
        for grid_id in due:
            if halted():
                return
            if self.retry_at.get(grid_id, 0.0) > now:
                continue
            try:
                with session_scope(self.settings.database_url) as session:
                    found = read_effects(session, self.tracker, grid_id)
                if found is None:
                    continue
                event_id, table = found
                to = sink()
                group_id = attempt(f"grid {grid_id}'s effects ({table.at})", lambda s=to, t=table: s.effects(t))
            except Exception as exc:  # noqa: BLE001 - one grid's table is that grid's, never the pass's
                self._refused(grid_id, str(exc) if isinstance(exc, TrackerUnavailable) else
                              f"{type(exc).__name__}: {exc}")  # fmt: skip
                continue
            self.retry_at.pop(grid_id, None)
            self._sent(grid_id, event_id, group_id)

    def _sent(self, grid_id: int, event_id: int, group_id: str | None) -> None:
        with session_scope(self.settings.database_url) as session:
            cursor = tracker_cursor(session, self.tracker, grid_id, None)
            cursor.event_id = event_id
            if group_id is not None and cursor.external_id is None:
                cursor.external_id = group_id  # an MLflow parent run the table made: the grid's runs open under it
            if cursor.failures:
                session.add(Event(grid_id=grid_id, kind=TRACKER_EVENT, data={"tracker": str(self.tracker)},
                                  message=f"tracker {self.tracker}: effects forwarded again after "
                                          f"{cursor.failures} failed attempt(s)"))  # fmt: skip
                cursor.failures, cursor.last_error = 0, None
            cursor.updated_at = utcnow()

    def _refused(self, grid_id: int, error: str) -> None:
        error = masked_text(error)
        log.warning("tracker %s: grid %s's effects not sent: %s", self.tracker, grid_id, error)
        with session_scope(self.settings.database_url) as session:
            cursor = tracker_cursor(session, self.tracker, grid_id, None)
            cursor.failures = (cursor.failures or 0) + 1
            cursor.last_error = error[:4000]
            cursor.updated_at = utcnow()
            failures = cursor.failures
            if failures == 1:
                session.add(Event(grid_id=grid_id, kind=TRACKER_EVENT, data={"tracker": str(self.tracker)},
                                  message=f"tracker {self.tracker}: the effects table was not sent: {error}"[:1000]))
        pause = min(self.settings.tracker_backoff_max_s, FIRST_RETRY_WAIT_S * 2**failures)
        self.retry_at[grid_id] = time.monotonic() + pause
