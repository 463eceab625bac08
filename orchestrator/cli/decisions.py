"""`ablate status <grid>` of a deciding grid: each decided comparison's decision at the latest look (the
look, the alpha spent, k and n), what is being run for the ones still open (results/deciding/decisions.py), and
why: the look's reason (with a borrowed seed variance, what it rested on). Read from GET /api/grids/{id}/decision."""

from __future__ import annotations

from rich.console import Console

from orchestrator.cli.tables import Column, print_table
from orchestrator.numbers import readable
from orchestrator.results.deciding.grid_decision import GridDecision

COLUMNS = [Column("comparison"), Column("metric", priority=2), Column("decision"), Column("look", justify="right"),
           Column("alpha spent", priority=1, justify="right"), Column("k", justify="right"),
           Column("n", priority=1, justify="right"), Column("running", priority=3),
           Column("why", priority=4)]  # fmt: skip


def print_decisions(decision: GridDecision, console: Console) -> None:
    """Nothing for a grid that does not decide."""
    state = decision.state
    if state is None:
        return
    running = {o.comparison: o.running for o in state.open}
    rows = []
    for c in decision.comparisons:
        name = f"{c.arm} vs {c.other_arm} ({c.against})"
        rows.append([name, c.metric, c.decision, str(c.look), readable(c.alpha_spent), str(c.k), str(c.n or "-"),
                     running.get(f"{name} on {c.metric}", "-"), c.reason or "-"])  # fmt: skip
    where = "decision ended" if state.final else f"{len(state.open)} open"
    title = f"grid {decision.grid_id} decides at {state.rate}: {state.looks} look(s), {where}; {state.spend}"
    if not rows:
        console.print(f"{title}: no look yet (the first comes when every arm's first seeds have ended)")
        return
    print_table(title, COLUMNS, rows, console)
