"""A run, its metrics and its events as the database holds them now (detached rows: read them after the
session closed)."""

from __future__ import annotations

from sqlalchemy import select

from orchestrator.db.models import Event, Grid, Metric, Run
from orchestrator.db.session import session_scope
from orchestrator.vocabulary import TERMINAL_STATES


def run_of(database_url: str, run_id: int) -> Run:
    with session_scope(database_url) as session:
        return session.get_one(Run, run_id)


def runs_of(database_url: str, ids: list[int]) -> list[Run]:
    """The runs of `ids`, in that order."""
    with session_scope(database_url) as session:
        return [session.get_one(Run, i) for i in ids]


def grid_runs(database_url: str, grid_id: int) -> list[Run]:
    with session_scope(database_url) as session:
        return list(session.get_one(Grid, grid_id).runs)


def runs_by_arm(database_url: str, grid_id: int) -> dict[str, Run]:
    return {r.arm: r for r in grid_runs(database_url, grid_id)}


def all_ended(database_url: str, ids: list[int]) -> bool:
    """Every run of `ids` is in a terminal state."""
    return all(r.state in TERMINAL_STATES for r in runs_of(database_url, ids))


def metrics_of(database_url: str, run_id: int) -> list[Metric]:
    """The run's metric rows by step."""
    with session_scope(database_url) as session:
        return list(session.scalars(select(Metric).where(Metric.run_id == run_id).order_by(Metric.step)))


def steps_of(database_url: str, run_id: int) -> list[int]:
    """The steps of the run's metric rows, in order."""
    with session_scope(database_url) as session:
        return list(session.scalars(select(Metric.step).where(Metric.run_id == run_id).order_by(Metric.step)))


def events_of(database_url: str, run_id: int) -> list[Event]:
    """The run's events in the order they were written."""
    with session_scope(database_url) as session:
        return list(session.scalars(select(Event).where(Event.run_id == run_id).order_by(Event.id)))


def stored_step(database_url: str, run_id: int) -> int:
    """The newest step whose checkpoint reached storage (a `checkpoint.stored` event); 0 before any."""
    return max((e.data["step"] for e in events_of(database_url, run_id) if e.kind == "checkpoint.stored"), default=0)
