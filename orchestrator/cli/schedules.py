"""`ablate schedules ...`: cron-fired sweeps on rented nodes (create, list, pause, resume, delete, run).

Talks to the database directly (ABLATE_DATABASE_URL), like `ablate nodes` and `ablate status`.
`ablate schedules run` is the sweep loop for a controller that does not run it inside `ablate serve`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from orchestrator.cli import app, migrated_database_url, service_errors
from orchestrator.cli.core import load_grid_file
from orchestrator.cli.tables import Column, print_table
from orchestrator.settings import load_settings

schedules_app = typer.Typer(no_args_is_help=True, help="Cron-fired sweeps on rented nodes (cron times are UTC).")
app.add_typer(schedules_app, name="schedules")


@schedules_app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="A short unique name, e.g. nightly-abcd")],
    cron: Annotated[str, typer.Option(help="Five-field cron expression in UTC, e.g. '0 22 * * *'")],
    grid: Annotated[Path, typer.Option(help="Grid YAML as `ablate submit` takes it")],
    nodes: Annotated[str | None, typer.Option(help="Comma-separated node names (`ablate nodes list`)")] = None,
    request: Annotated[
        Path | None, typer.Option(help="Instead of --nodes: YAML of nodes to rent at each fire (provider, gpu, ...)")
    ] = None,
    budget: Annotated[float | None, typer.Option(help="Most to spend per sweep: sum of price/hour x hours")] = None,
    misfire: Annotated[
        str, typer.Option(help="A fire missed while the controller was down: run_once (late) or skip")
    ] = "run_once",
) -> None:
    """Schedule a grid: at each fire, provision the nodes, run it, copy results back, tear down."""
    from orchestrator.db.session import session_scope
    from orchestrator.sweeps.schedules import ScheduleCreate, create_schedule

    body_grid = load_grid_file(grid)
    node_list = [n.strip() for n in nodes.split(",") if n.strip()] if nodes is not None else None
    wanted = load_grid_file(request) if request is not None else None  # the same YAML reading and errors
    with service_errors():
        body = ScheduleCreate(
            name=name,
            cron=cron,
            grid=body_grid,
            nodes=node_list,
            request=wanted,  # type: ignore[arg-type]
            budget=budget,
            misfire=misfire,  # type: ignore[arg-type]
        )
        with session_scope(migrated_database_url()) as session:
            schedule = create_schedule(session, body)
            first = schedule.next_fire_at
    typer.echo(f"schedule {name} created; first fire {first:%Y-%m-%d %H:%M} UTC")


def _node_cell(name: str, state: str | None) -> Text:
    """A node name; in red, and said in words, when its teardown failed (it may still be billing)."""
    from orchestrator.vocabulary import NodeState

    if state == NodeState.teardown_failed:
        return Text(f"{name} (TEARDOWN FAILED)", style="bold red")
    return Text(name)


def _wanted(request: dict | None) -> Text:
    """A request schedule's nodes cell: `rent 2x 4x RTX_4090 @vast <= 0.45/GPU-h`."""
    if request is None:
        return Text("-")
    r = request
    cap = r["max_price_per_gpu_hour"]
    return Text(f"rent {r['nodes']}x {r['gpus_per_node']}x {r['gpu']} @{r['provider']} <= {cap}/GPU-h")


@schedules_app.command("list")
def list_() -> None:
    """Schedules with their next fire and their latest sweep."""
    from orchestrator.api.schemas import SchedulePublic
    from orchestrator.db.session import session_scope
    from orchestrator.fleet.inventory import list_nodes
    from orchestrator.sweeps.schedules import list_schedules

    columns = [
        Column("name"),
        Column("cron", priority=2),
        Column("nodes"),
        Column("budget", priority=3, justify="right"),
        Column("misfire", priority=4),
        Column("status"),
        Column("next fire", priority=1),
        Column("last sweep"),
    ]
    rows = []
    with service_errors(), session_scope(migrated_database_url()) as session:
        states = {n.name: n.state for n in list_nodes(session)}
        for s in list_schedules(session):
            p = SchedulePublic.model_validate(s)
            last = "-"
            if p.sweeps:
                w = p.sweeps[0]
                last = f"#{w.id} {w.state} spent {w.spend:.2f}" + (" (late)" if w.late else "")
            nxt = f"{p.next_fire_at:%Y-%m-%d %H:%M}" if p.next_fire_at and not p.paused else "-"
            rows.append(
                [
                    p.name,
                    p.cron,
                    Text(",").join(_node_cell(n, states.get(n)) for n in p.nodes) if p.nodes else _wanted(p.request),
                    "-" if p.budget is None else f"{p.budget:g}",
                    p.misfire,
                    "paused" if p.paused else "active",
                    nxt,
                    last,
                ]
            )
    print_table("schedules (UTC)", columns, rows)


@schedules_app.command("pause")
def pause(name: Annotated[str, typer.Argument(help="Schedule name")]) -> None:
    """No more fires until resumed (a sweep under way carries on)."""
    from orchestrator.db.session import session_scope
    from orchestrator.sweeps.schedules import pause_schedule

    with service_errors(), session_scope(migrated_database_url()) as session:
        pause_schedule(session, name)
    typer.echo(f"schedule {name} paused")


@schedules_app.command("resume")
def resume(name: Annotated[str, typer.Argument(help="Schedule name")]) -> None:
    """Fire again from the next cron time (fires that fell in the pause are not run)."""
    from orchestrator.db.session import session_scope
    from orchestrator.sweeps.schedules import resume_schedule

    with service_errors(), session_scope(migrated_database_url()) as session:
        nxt = resume_schedule(session, name).next_fire_at
    typer.echo(f"schedule {name} resumed; next fire {nxt:%Y-%m-%d %H:%M} UTC")


@schedules_app.command("delete")
def delete(name: Annotated[str, typer.Argument(help="Schedule name")]) -> None:
    """Delete a schedule and its sweep history (refused while a sweep is under way)."""
    from orchestrator.db.session import session_scope
    from orchestrator.sweeps.schedules import delete_schedule

    with service_errors(), session_scope(migrated_database_url()) as session:
        delete_schedule(session, name)
    typer.echo(f"schedule {name} deleted")


@schedules_app.command("run")
def run(interval: Annotated[float, typer.Option(help="Seconds between ticks")] = 30.0) -> None:
    """Fire schedules and drive their sweeps in the foreground until interrupted."""
    from orchestrator.sweeps.runner import SweepRunner

    settings = load_settings()
    with service_errors():  # a provider key file that is unusable is one line, not a traceback
        runner = SweepRunner.from_settings(settings)
    typer.echo(f"sweep runner: ticking every {interval:g} s against {settings.database_url.split('@')[-1]}")
    try:
        runner.run_forever(interval)
    except KeyboardInterrupt:
        typer.echo("sweep runner stopped")
