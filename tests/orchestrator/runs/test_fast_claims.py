"""A run's claim to go too fast (issue 63): a record's `iter_per_sec` inside the span around its plan's rate
(10x of measured hours, 1e5x of a FLOP estimate) made its run's hours left about 0, so the re-planning
believed its GPUs free now and started a queued arm on them. Its hours left are at least those at the
pace the controller saw between the node's own records (runs/observed_pace.py), over a real database with
a fake clock and the launcher's own re-planning (`Replanner.redraw`)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from sqlalchemy import select

from orchestrator.db.models import Event, Metric
from orchestrator.db.session import session_scope
from orchestrator.grids.planner import speedup
from orchestrator.runs.replan import CLAIM_BOUNDED, Held, Replanner, remaining_hours
from tests.kit.clock import FakeClock
from tests.orchestrator.runs.test_progress_claims import (
    EXPECTED,
    QUAD,
    SCALING,
    SEEN_AT,
    SEEN_H,
    START,
    lying,
    quad_grid,
    running,
)

# (source, how much faster than the plan): inside a measured plan's span (10x) and an estimate's (1e5x)
FAST = [("measured", 9.0), ("estimated", 9e4)]


@pytest.mark.parametrize(("source", "faster"), FAST)
def test_a_claim_faster_than_the_pace_seen_between_records_is_held_to_it(
    database_url: str, source: str, faster: float
) -> None:
    """P's records arrive 10 steps per 180 s (the plan's pace) while claiming 9x or 9e4x that: its hours
    left are the 0.4 h of its 80 steps at the pace seen, not 0.044 h or 4e-6 h, and an event says so."""
    with session_scope(database_url) as session:
        grid = quad_grid(session, f"racer {source}", {"P": 0.5, "Q": 3.0}, source)
        p, _ = grid.runs
        lying(p, EXPECTED * faster)
        session.flush()
        assert remaining_hours(p, 1, SEEN_AT) == pytest.approx(SEEN_H)
        assert remaining_hours(p, 1, SEEN_AT + timedelta(hours=0.1)) == pytest.approx(SEEN_H - 0.1)
        (bounded,) = session.scalars(select(Event).where(Event.run_id == p.id, Event.kind == CLAIM_BOUNDED)).all()
        assert bounded.data == {"step": 20}
        assert "faster than the pace the controller saw between its records" in bounded.message


@pytest.mark.parametrize(("source", "faster"), FAST)
def test_a_claim_faster_than_the_pace_seen_does_not_free_its_gpus_early(
    database_url: str, source: str, faster: float
) -> None:
    """Q queued while P holds one of four GPUs: the plan redrawn waits 0.4 h for P's GPU and runs Q on all
    four. With P's claim believed, P ended now and Q was due now on four GPUs, one of them P's."""
    with session_scope(database_url) as session:
        grid = quad_grid(session, f"replan racer {source}", {"P": 0.5, "Q": 3.0}, source)
        p, q = grid.runs
        lying(p, EXPECTED * faster)
        session.flush()
        redraws = Replanner(FakeClock(SEEN_AT)).redraw(session, [q], QUAD, {p.id: Held("quad", 1)})
        session.flush()
        plan = json.loads(json.dumps(grid.plan))
        assert q.id in redraws.planned and q.id not in redraws.due
    assert plan["night_h"] == pytest.approx(SEEN_H + 3.0 / speedup(4, SCALING), abs=1e-3), plan


def test_a_claim_up_to_twice_the_pace_seen_stands(database_url: str) -> None:
    """Records that arrive in bursts make the pace between them uneven; a claim within 2x of it stands."""
    with session_scope(database_url) as session:
        grid = quad_grid(session, "brisk", {"P": 0.5, "Q": 3.0})
        p, _ = grid.runs
        lying(p, 1.9 * EXPECTED)
        session.flush()
        assert remaining_hours(p, 1, SEEN_AT) == pytest.approx(80 / (1.9 * EXPECTED) / 3600)
        assert not session.scalars(select(Event).where(Event.run_id == p.id, Event.kind == CLAIM_BOUNDED)).all()


def test_with_one_arrival_there_is_no_pace_between_records(database_url: str) -> None:
    """One batch of records (both steps in one reply) has no time between them: the claim, within its span,
    stands (recorded: the pace from the placement bounds only a slower claim)."""
    with session_scope(database_url) as session:
        grid = quad_grid(session, "one batch", {"P": 0.5, "Q": 3.0})
        p, _ = grid.runs
        running(p, None)
        at = START + timedelta(seconds=360)
        for step in (10, 20):
            p.metrics.append(Metric(step=step, iter_per_sec=9 * EXPECTED, created_at=at, extra={"ranks": 1}))
        session.flush()
        assert remaining_hours(p, 1, at) == pytest.approx(80 / (9 * EXPECTED) / 3600)
