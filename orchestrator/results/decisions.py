"""A deciding grid's looks as the read side shows them: each comparison's decision at a look (stored in
`decision_looks` by results/decider.py), attached to the report's effects, and the comparisons still open
with the work queued for each (the dashboard's panel, `ablate status`).

A decision is per comparison (an arm against its parent or the control on one decided metric): better or
worse when the group-sequential boundary excludes zero, equivalent when the interval lies inside
±margin, undecided at the budget, open while more seeds or images may still decide it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.orm import Session

from model.spec import ArmSpec
from orchestrator.db.models import DecisionLook, Grid
from orchestrator.grids.deciding import DecideSpec
from orchestrator.grids.replicates import grid_cost
from orchestrator.results.reports.model import Effect

Decision = Literal["better", "worse", "equivalent", "undecided", "open"]
Action = Literal["seed", "images"]
DECIDED: tuple[Decision, ...] = ("better", "worse", "equivalent")


class ComparisonLook(BaseModel):
    """One comparison at one look: what the interval was, what was decided, what is run next for it."""

    arm: str
    against: Literal["parent", "control"]
    other_arm: str
    metric: str
    diff: float
    low: float | None
    high: float | None
    k: int  # seeds compared
    n: int | None  # held-out images
    decision: Decision
    look: int  # 1-based: the look this decision was taken at (a decided comparison keeps its look)
    alpha_spent: float  # the alpha spent up to this look (by its information fraction)
    action: Action | None = None  # what this look queued for it (open only)
    reason: str = ""

    def key(self) -> tuple[str, str, str]:
        return self.arm, self.metric, self.against


def grid_looks(session: Session, grid_id: int) -> list[DecisionLook]:
    """The grid's looks, first to last."""
    rows = select(DecisionLook).where(DecisionLook.grid_id == grid_id).order_by(DecisionLook.wave)
    return list(session.scalars(rows))


def latest_look(session: Session, grid_id: int) -> DecisionLook | None:
    looks = grid_looks(session, grid_id)
    return looks[-1] if looks else None


def look_comparisons(look: DecisionLook | None) -> list[ComparisonLook]:
    return [ComparisonLook.model_validate(c) for c in look.comparisons] if look is not None else []


def with_decisions(session: Session, grid: Grid, effects: list[Effect]) -> list[Effect]:
    """The effects of a deciding grid with each decided metric's decision from the latest look (the others
    unchanged); a grid that does not decide, or has not looked yet, keeps its effects as they are."""
    if not grid.decide:
        return effects
    found = {c.key(): c for c in look_comparisons(latest_look(session, grid.id))}
    out = []
    for e in effects:
        c = found.get((e.arm, e.metric, e.against))
        out.append(e if c is None else e.model_copy(update={
            "decision": c.decision, "look": c.look, "alpha_spent": c.alpha_spent}))  # fmt: skip
    return out


class OpenComparison(BaseModel):
    """A comparison still open and what is run for it now (the dashboard's panel)."""

    comparison: str  # "B vs A (parent) on val_flow_ivw"
    look: int
    running: str  # "one more seed of B and A (seed 3)" | "an evaluation on 1024 images"


class DecisionState(BaseModel):
    """Where a deciding grid stands: its looks so far, whether it has stopped adding work, what is open."""

    alpha: float
    looks: int
    final: bool
    decided: int
    undecided: int
    open: list[OpenComparison]


def decision_state(session: Session, grid: Grid) -> DecisionState | None:
    """None for a grid that does not decide."""
    if not grid.decide:
        return None
    looks = grid_looks(session, grid.id)
    last = looks[-1] if looks else None
    comps = look_comparisons(last)
    actions = {a.get("action"): a for a in (last.actions if last is not None else [])}
    open_ = []
    for c in comps:
        if c.decision != "open":
            continue
        images = (actions.get(c.action) or {}).get("images")
        running = {"seed": f"one more seed of {c.arm} and {c.other_arm}",
                   "images": f"an evaluation on {images} held-out images"}.get(c.action or "", "nothing")
        open_.append(OpenComparison(comparison=f"{c.arm} vs {c.other_arm} ({c.against}) on {c.metric}",
                                    look=c.look, running=running))  # fmt: skip
    return DecisionState(
        alpha=float(grid.decide.get("alpha", 0.05)), looks=len(looks), final=bool(last is not None and last.final),
        decided=sum(c.decision in DECIDED for c in comps), undecided=sum(c.decision == "undecided" for c in comps),
        open=open_,
    )  # fmt: skip


def decision_json(session: Session, grid: Grid) -> dict | None:
    """decision_state as JSON (the dashboard's data), None for a grid that does not decide."""
    state = decision_state(session, grid)
    return state.model_dump(mode="json") if state is not None else None


class DecideCost(BaseModel):
    """What a deciding grid may cost, projected at submit (grids/replicates.py's rates): the worst case,
    every comparison open to the budget (every arm at max_seeds), and the expected GPU-hours
    (results/sequential.py); None where a command arm cannot be projected."""

    worst_case_gpu_hours: float | None
    expected_gpu_hours: float | None
    words: str


def decide_cost(specs: list[ArmSpec], decide: DecideSpec) -> DecideCost:
    from orchestrator.results import sequential

    first, worst = grid_cost(specs, decide.min_seeds), grid_cost(specs, decide.max_seeds)
    expected = sequential.expected_gpu_hours(first.gpu_hours, worst.gpu_hours, decide) if worst.gpu_hours else None
    words = (f"deciding: {len(specs)} arms from {decide.min_seeds} to {decide.max_seeds} seeds at alpha "
             f"{decide.alpha:g}: worst case {worst.projected:,.1f} GPU-hours (every comparison open to the budget)")
    words += f", expected {expected:,.1f}" if expected is not None else ", expected not projected (command arms)"
    return DecideCost(worst_case_gpu_hours=worst.gpu_hours, expected_gpu_hours=expected, words=words)
