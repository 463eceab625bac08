"""The night plan as the CLI prints it: `ablate plan` and `ablate submit` show the same table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console

from orchestrator.cli.tables import Column, print_table

if TYPE_CHECKING:
    from orchestrator.grids.night import PlanPublic

PLAN_COLUMNS = [Column("run"), Column("GPUs", justify="right"), Column("node", priority=2),
                Column("start h", justify="right"), Column("end h", justify="right"),
                Column("GPU-h / run", priority=1, justify="right"), Column("fixed h", priority=1, justify="right"),
                Column("cost from", priority=1)]


def print_plan(plan: PlanPublic, console: Console | None = None) -> None:
    """The plan as a table of run, GPUs, start, end; the last line `night X h; lower bound Y h`."""
    console = console or Console()
    rows = [
        [s.run, str(s.gpus), s.node, f"{s.start_h:.2f}", f"{s.end_h:.2f}",
         f"{plan.hours[s.arm]:.2f}" if plan.hours.get(s.arm) is not None else "-",
         f"{plan.fixed_h.get(s.arm, 0.0):.2f}", plan.sources.get(s.arm, "-")]
        for s in plan.slots
    ]  # fmt: skip
    scaling = ", ".join(f"{g} GPUs {s:.2f}x" for g, s in sorted(plan.scaling.items())) or "none measured"
    title = f"night plan ({plan.search} search; scaling {plan.scaling_source}: {scaling}; others 0.98 per doubling)"
    print_table(title, PLAN_COLUMNS, rows, console)
    if plan.gpu_model:
        console.print(f"measured rates: {plan.gpu_model}", highlight=False)
    if plan.unplanned:
        console.print(f"not planned (no projection, or no node holds them): {', '.join(plan.unplanned)}",
                      highlight=False)
    console.print(plan.last_line(), highlight=False)
