"""Compare-and-set state changes of a run, shared by the launcher and the grid service (the API's stop)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from orchestrator.db.models import Run
from orchestrator.vocabulary import RunState


def transition(session: Session, run: Run, from_state: RunState, **values: Any) -> bool:
    """Compare-and-set: UPDATE the run to `values` only if it is still `from_state` in the DB.

    True when this session won (the in-memory run then carries the values); False when another
    writer (the API's stop, another launcher pass) changed the state first: nothing is written and
    the caller must not act on the old state.
    """
    result = session.execute(
        update(Run)
        .where(Run.id == run.id, Run.state == from_state)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:
        session.refresh(run)
        return False
    for key, value in values.items():
        set_committed_value(run, key, value)
    return True
