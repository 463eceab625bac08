"""The effects table a grid's trackers get (orchestrator/trackers/ sends it): the report's effects, one row
each, with the 95% interval, the decision (a deciding grid's at its latest look, else what the interval
can tell), why that look decided so (its reason: empty where no look judged the row) and what the interval
covers.

It is a snapshot stored as a grid event (`effects`) when the report is written and, for a deciding grid,
after each look: a tracker reached late (down, or a controller restarted) still gets the table as it was
at that look, never one read while the next wave's runs are half done.
"""

from __future__ import annotations

import logging
import math

from pydantic import BaseModel
from sqlalchemy import exists, select
from sqlalchemy.orm import Session

from orchestrator.db.models import DecisionLook, Event, Grid
from orchestrator.db.session import session_scope
from orchestrator.results.deciding.decider import current_effects
from orchestrator.results.deciding.decisions import latest_look, with_decisions
from orchestrator.results.reports.effects import reading_words
from orchestrator.results.reports.model import Effect
from orchestrator.settings import Settings

log = logging.getLogger(__name__)
EFFECTS_EVENT = "effects"
COLUMNS = ("arm", "vs", "metric", "diff", "low", "high", "k", "n", "decision", "reason", "covers")


class EffectRow(BaseModel):
    """One effect as a tracker shows it (COLUMNS, in that order)."""

    arm: str
    vs: str  # the other arm and which it is: "A (control)", "B (parent)"
    metric: str
    diff: float | None  # arm - other, at the final checkpoint, mean over the seeds
    low: float | None  # the report's 95% interval (None: no interval)
    high: float | None
    k: int  # training seeds compared
    n: int | None  # evaluation images (None: they differ between seeds)
    decision: str  # a deciding grid's decision, else the report's reading ("within noise", ...)
    reason: str = ""  # the look's reason for `decision` ("" where no look judged it; a table stored before it had none)
    covers: str  # the noise the interval covers, in words

    def cells(self) -> list[float | int | str | None]:
        return [getattr(self, c) for c in COLUMNS]


class EffectsTable(BaseModel):
    """A grid's effects at one moment: after look `look` of a deciding grid, or in its final report."""

    look: int | None  # the latest look (1-based) the decisions are from; None for a grid that does not decide
    final: bool  # the report's: the grid ended
    rows: list[EffectRow]

    @property
    def at(self) -> str:
        """When, in words: "look 2", "final report (look 3)", "final report"."""
        look = f"look {self.look}" if self.look is not None else ""
        if not self.final:
            return look
        return f"final report ({look})" if look else "final report"


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None  # a JSON column holds no NaN


def effect_row(e: Effect) -> EffectRow:
    ns = {s.n for s in e.per_seed if s.n}
    n = e.n if e.n is not None else (ns.pop() if len(ns) == 1 else None)
    decision = e.decision or ("stand-in: no verdict" if e.standin else reading_words(e))
    return EffectRow(arm=e.arm, vs=f"{e.other_arm} ({e.against})", metric=e.metric, diff=_finite(e.diff),
                     low=_finite(e.low), high=_finite(e.high), k=e.k, n=n, decision=decision,
                     reason=e.decision_reason or "", covers=e.noise)  # fmt: skip


def record_effects(session: Session, grid: Grid, effects: list[Effect], final: bool) -> EffectsTable | None:
    """Store the grid's effects table for its trackers (None stored for a grid naming none)."""
    if not grid.trackers:
        return None
    look = latest_look(session, grid.id)
    table = EffectsTable(look=look.wave + 1 if look is not None else None, final=final,
                         rows=[effect_row(e) for e in effects])  # fmt: skip
    session.add(Event(grid_id=grid.id, kind=EFFECTS_EVENT, data=table.model_dump(mode="json"),
                      message=f"effects for the trackers ({table.at}): {len(table.rows)} comparisons"))  # fmt: skip
    return table


def latest_effects(session: Session, grid_id: int) -> tuple[int, EffectsTable] | None:
    """The grid's latest effects table and its event's id (what a tracker's cursor moves past)."""
    event = session.scalar(select(Event).where(Event.grid_id == grid_id, Event.run_id.is_(None),
                                               Event.kind == EFFECTS_EVENT).order_by(Event.id.desc()).limit(1))
    return (event.id, EffectsTable.model_validate(event.data)) if event is not None else None


def record_look_effects(settings: Settings) -> list[int]:
    """After a deciding grid's look, the table with that look's decisions, for each grid naming trackers
    whose decision goes on (its final look's table comes with its report); returns their ids. A grid whose
    effects cannot be read is logged and tried again on the next pass; the others go on."""
    final = exists().where(DecisionLook.grid_id == Grid.id, DecisionLook.final)
    looked = exists().where(DecisionLook.grid_id == Grid.id)
    with session_scope(settings.database_url) as session:
        due = [g.id for g in session.scalars(select(Grid).where(Grid.decide.is_not(None), looked, ~final))
               if g.trackers]  # fmt: skip
    recorded = []
    for grid_id in due:
        try:
            with session_scope(settings.database_url) as session:
                grid = session.get_one(Grid, grid_id)
                look, last = latest_look(session, grid_id), latest_effects(session, grid_id)
                if look is None or (last is not None and last[1].look == look.wave + 1):
                    continue
                effects = with_decisions(session, grid, current_effects(session, grid))
                record_effects(session, grid, effects, final=False)
            recorded.append(grid_id)
        except Exception:  # noqa: BLE001 - a table must never stop the launcher's pass
            log.exception("effects of grid %s for its trackers failed", grid_id)
    return recorded
