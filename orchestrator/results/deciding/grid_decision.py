"""A grid's decision in one answer (GET /api/grids/{id}/decision; `ablate status ID`, `ablate mcp`): where the
decision stands, each comparison at the latest look (its decision, interval, the alpha it spends), what the
grid has spent against decide.max_gpu_hours, and what each open comparison is still run for."""

from __future__ import annotations

from pydantic import BaseModel
from sqlalchemy.orm import Session

from orchestrator.db.models import Grid
from orchestrator.results.deciding.budget import spent_gpu_hours
from orchestrator.results.deciding.decisions import (
    ComparisonLook,
    DecisionState,
    decision_state,
    latest_look,
    look_comparisons,
)


class GridDecision(BaseModel):
    """`state` None and no comparisons: the grid does not decide (a fixed number of seeds)."""

    grid_id: int
    state: DecisionState | None
    comparisons: list[ComparisonLook]  # at the latest look; empty before the first
    spent_gpu_hours: float  # the runs' measured GPU-hours and the evaluations' (results/deciding/budget.py)
    max_gpu_hours: float | None  # decide.max_gpu_hours, as stored or its default (the worst case)

    @classmethod
    def of(cls, session: Session, grid: Grid) -> GridDecision:
        state = decision_state(session, grid)
        if state is None:
            return cls(grid_id=grid.id, state=None, comparisons=[], spent_gpu_hours=spent_gpu_hours(session, grid),
                       max_gpu_hours=None)  # fmt: skip
        # The state has read the spend and the cap already: the same numbers, not a second pass over the jobs.
        return cls(grid_id=grid.id, state=state, comparisons=look_comparisons(latest_look(session, grid.id)),
                   spent_gpu_hours=state.spent_gpu_hours, max_gpu_hours=state.max_gpu_hours)  # fmt: skip
