"""When a grid's own tracker run ends: once every run of the grid ended and each was finished in that
tracker, and no look of a deciding grid can add more runs (its decision ended: a final look), the grid's run
(an MLflow parent run) is finished too, with a state for the whole grid. Between a deciding grid's waves every
run has ended, yet the next look may queue seeds: their runs open under a parent still RUNNING."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Grid, Run, TrackerRun
from orchestrator.results.deciding.decider import decision_pending
from orchestrator.trackers.base import GroupEnd
from orchestrator.vocabulary import DETECTOR_STOPS, TERMINAL_STATES, RunState, TrackerName


def grid_end_state(runs: Sequence[tuple[str, str | None]]) -> RunState:
    """The grid's end from its runs' (state, decision): failed when any failed, stopped when the user stopped
    any (not the detector: arms it stopped are a grid's normal outcome), else completed."""
    if any(state == RunState.failed for state, _ in runs):
        return RunState.failed
    if any(state == RunState.stopped and decision not in DETECTOR_STOPS for state, decision in runs):
        return RunState.stopped
    return RunState.completed


def ended_groups(session: Session, tracker: TrackerName) -> list[GroupEnd]:
    """The grids whose tracker run `tracker` opened and has not finished, now that each of their runs ended
    and was finished in the tracker, and (a deciding grid) its decision ended."""
    groups = session.scalars(
        select(TrackerRun).where(TrackerRun.tracker == tracker, TrackerRun.run_id.is_(None),
                                 TrackerRun.external_id.is_not(None), TrackerRun.closed.is_(False))
    ).all()  # fmt: skip
    ended = []
    for group in groups:
        runs = session.execute(select(Run.id, Run.state, Run.decision).where(Run.grid_id == group.grid_id)).all()
        if not runs or any(state not in TERMINAL_STATES for _, state, _ in runs):
            continue
        finished = set(session.scalars(select(TrackerRun.run_id).where(
            TrackerRun.tracker == tracker, TrackerRun.grid_id == group.grid_id, TrackerRun.closed.is_(True))))
        if not {run_id for run_id, _, _ in runs} <= finished:
            continue  # a run's last status is still on its way: the children end before their parent
        grid = session.get(Grid, group.grid_id)
        if grid is not None and decision_pending(session, grid):
            continue  # its next look may add seeds: they belong under this parent, still open
        counts = Counter(state for _, state, _ in runs)
        words = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        state = grid_end_state([(state, decision) for _, state, decision in runs])
        ended.append(GroupEnd(group.grid_id, str(group.external_id), state, words))
    return ended
