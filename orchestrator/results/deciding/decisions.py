"""A deciding grid's looks as the read side shows them: each comparison's decision at a look (stored in
`decision_looks` by results/deciding/decider.py), attached to the report's effects, and the comparisons still open
with the work queued for each (the dashboard's panel, `ablate status`).

A decision is per comparison (an arm against its parent or the control on one decided metric): better or
worse when the group-sequential boundary excludes zero, equivalent when the interval lies inside
±margin, undecided at the budget, open while more seeds or images may still decide it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, field_serializer
from sqlalchemy import select
from sqlalchemy.orm import Session

from model.spec import ArmSpec
from orchestrator.db.models import DecisionLook, Grid
from orchestrator.grids.deciding import DecideSpec, decide_of, family_size
from orchestrator.numbers import finite_or_none, json_safe, readable
from orchestrator.results.deciding.budget import budget_of, spent_gpu_hours
from orchestrator.results.reports.model import Effect

Decision = Literal["better", "worse", "equivalent", "undecided", "open"]
Action = Literal["seed", "images"]
DECIDED: tuple[Decision, ...] = ("better", "worse", "equivalent")
# Closed for good in its grid: never judged, or paid for, again (undecided: for futility, or at its budget).
CLOSED: tuple[Decision, ...] = (*DECIDED, "undecided")


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
    fractions: list[float] = []  # the information fraction of each of its looks so far (the boundary's input)
    seeds: list[int] = []  # the seeds of each of those looks (the levels of few df: levels.seed_limit_levels)
    action: Action | None = None  # what this look queued for it (open only)
    reason: str = ""

    @field_serializer("diff", "low", "high", when_used="json")
    def _finite_in_json(self, value: float | None) -> float | str | None:
        # An unbounded interval (-inf: one seed, or a boundary alpha near 0) kept as "-inf", which reads
        # back as a float: Postgres JSON refuses the -Infinity token that json.dumps would write.
        return json_safe(value)

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
    """The effects of a deciding grid, its decided metrics' rows first, each with its decision from the latest
    look, and every row's reading marked descriptive: a fixed-sample interval (the plain mean's beside the
    decided headline's, or the decided row's own) is no call at the grid's error rate, its decision is; a grid
    that does not decide keeps its effects as they are."""
    decide = decide_of(grid)
    if decide is None:
        return effects
    found = {c.key(): c for c in look_comparisons(latest_look(session, grid.id))}
    out = []
    for e in effects:
        c = found.get((e.arm, e.metric, e.against))
        decision = {} if c is None else {"decision": c.decision, "look": c.look, "alpha_spent": c.alpha_spent,
                                         "decision_reason": c.reason or None, "decision_low": finite_or_none(c.low),
                                         "decision_high": finite_or_none(c.high)}  # fmt: skip
        out.append(e.model_copy(update={"descriptive": True, **decision}))
    return sorted(out, key=lambda e: e.metric not in decide.margin)  # stable: each part keeps the report's order


def submitted_arms(grid: Grid) -> list[tuple[str, ArmSpec]]:
    """The grid's arms as submitted (each arm's first seed's spec), in the grid's order."""
    arms = []
    for r in sorted(grid.runs, key=lambda r: r.position):
        if r.seed == 0:
            try:
                arms.append((r.arm, ArmSpec.model_validate(r.spec)))
            except ValueError:  # a spec this version no longer reads: not a comparison submitted now
                continue
    return arms


def comparison_alpha_of(decide: DecideSpec, comparisons: int) -> float:
    """The alpha each comparison spends: decide.alpha, or familywise its Bonferroni share over the grid's
    `comparisons` (results/deciding/sequential.py comparison_alpha)."""
    from orchestrator.results.deciding import sequential

    return sequential.comparison_alpha(decide.alpha, comparisons, decide.error_rate)


def grid_comparison_alpha(grid: Grid, decide: DecideSpec) -> float:
    """The alpha each of the grid's comparisons spends at its looks (m: grids/deciding.py family_size)."""
    return comparison_alpha_of(decide, family_size(submitted_arms(grid), grid.control_arm, decide))


def rate_words(decide: DecideSpec, comparisons: int) -> str:
    """The error rate alpha holds, in words: "alpha 0.05 per comparison", or "alpha 0.05 familywise over 4
    comparisons (0.0125 a comparison)"."""
    if decide.error_rate == "familywise":
        return (f"alpha {decide.alpha:g} familywise over {comparisons} comparison{'s' * (comparisons != 1)} "
                f"({comparison_alpha_of(decide, comparisons):.4g} a comparison)")  # fmt: skip
    return f"alpha {decide.alpha:g} per comparison"


class OpenComparison(BaseModel):
    """A comparison still open and what is run for it now (the dashboard's panel)."""

    comparison: str  # "B vs A (parent) on val_flow_ivw"
    look: int
    running: str  # "one more seed of B and A (seed 3)" | "an evaluation on 1024 images"


class DecisionState(BaseModel):
    """Where a deciding grid stands: its looks so far, whether it has stopped adding work, what is open."""

    alpha: float
    error_rate: str  # decide.error_rate: "per-comparison" or "familywise"
    comparison_alpha: float  # the alpha each comparison spends (familywise: alpha/m)
    rate: str  # rate_words: "alpha 0.05 per comparison"
    looks: int
    final: bool
    decided: int
    undecided: int
    open: list[OpenComparison]
    metrics: list[str]  # the decided metrics (decide.margin's): their rows lead the effects table
    spent_gpu_hours: float  # the runs' and evaluation jobs' measured GPU-hours (results/deciding/budget.py)
    max_gpu_hours: float | None  # decide.max_gpu_hours as stored (its worst case by default); None: no cap
    spend: str  # spend_words: "spent 1.23 of 40 GPU-hours (3%, decide.max_gpu_hours)"


def spend_words(spent: float, cap: float | None) -> str:
    """What a deciding grid has spent against its cap, in words, with enough digits for a CPU demo's
    hundredths of an hour."""
    if cap is None:
        return f"spent {readable(spent, 3)} GPU-hours (no decide.max_gpu_hours cap)"
    return (f"spent {readable(spent, 3)} of {readable(cap, 3)} GPU-hours ({100 * spent / cap:.0f}%, "
            "decide.max_gpu_hours)")


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
    decide = decide_of(grid)
    assert decide is not None
    m = family_size(submitted_arms(grid), grid.control_arm, decide)
    spent, cap = spent_gpu_hours(session, grid), budget_of(grid).max_gpu_hours
    return DecisionState(
        alpha=decide.alpha, error_rate=decide.error_rate, comparison_alpha=comparison_alpha_of(decide, m),
        rate=rate_words(decide, m), looks=len(looks), final=bool(last is not None and last.final),
        decided=sum(c.decision in DECIDED for c in comps), undecided=sum(c.decision == "undecided" for c in comps),
        open=open_, metrics=list(decide.margin), spent_gpu_hours=spent, max_gpu_hours=cap,
        spend=spend_words(spent, cap),
    )  # fmt: skip


def deciding_words(session: Session, grid: Grid) -> str | None:
    """The report's deciding header: the error rate held, the seeds, where the decision stands; None for a
    grid that does not decide."""
    state = decision_state(session, grid)
    decide = decide_of(grid)
    if state is None or decide is None:
        return None
    where = ("decision ended" if state.final else f"{len(state.open)} open") if state.looks else "no look yet"
    return (f"Decided look by look, {decide.min_seeds} to {decide.max_seeds} seeds, at {state.rate}, held over "
            f"all looks: {state.looks} look(s), {state.decided} decided, {state.undecided} undecided, "
            f"{where}; {state.spend}.")  # fmt: skip


def decision_json(session: Session, grid: Grid) -> dict | None:
    """decision_state as JSON (the dashboard's data), None for a grid that does not decide."""
    state = decision_state(session, grid)
    return state.model_dump(mode="json") if state is not None else None


def futility_of(decide: DecideSpec) -> float:
    """The grid's futility bound: its own, else the maths' default (results/deciding/sequential.py FUTILITY)."""
    from orchestrator.results.deciding import sequential

    return sequential.FUTILITY if decide.futility is None else decide.futility
