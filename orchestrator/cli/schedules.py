"""`ablate schedules ...`: cron-fired sweeps on rented nodes (create, list, pause, resume, delete, run).

create, list, pause, resume and delete ask the controller's REST API under /api/schedules (ABLATE_URL or
--url, the token). `ablate schedules run` is the sweep loop itself, for a controller that does not run it
inside `ablate serve`: it works on the controller's database (ABLATE_DATABASE_URL).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from orchestrator.cli import app, service_errors
from orchestrator.cli.core import load_grid_file
from orchestrator.cli.remote import JsonOption, UrlOption, controller, print_json
from orchestrator.cli.tables import Column, print_table
from orchestrator.settings import load_settings

schedules_app = typer.Typer(no_args_is_help=True, help="Cron-fired sweeps on rented nodes (cron times are UTC).")
app.add_typer(schedules_app, name="schedules")

NameArgument = Annotated[str, typer.Argument(help="Schedule name")]


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
    url: UrlOption = None,
) -> None:
    """Schedule a grid: at each fire, provision the nodes, run it, copy results back, tear down."""
    body = {
        "name": name,
        "cron": cron,
        "grid": load_grid_file(grid),
        "nodes": [n.strip() for n in nodes.split(",") if n.strip()] if nodes is not None else None,
        "request": load_grid_file(request) if request is not None else None,  # the same YAML reading and errors
        "budget": budget,
        "misfire": misfire,
    }
    with controller(url, token_needed=True) as client:
        first = client.create_schedule(body).next_fire_at
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
def list_(url: UrlOption = None, as_json: JsonOption = False) -> None:
    """Schedules with their next fire and their latest sweep (GET /api/schedules)."""
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
    with controller(url, token_needed=True) as client:
        found = client.schedules()
        if as_json:
            print_json(found)
            return
        states = {n.name: n.state for n in client.nodes()}  # a node whose teardown failed is shown in red
    rows = []
    for p in found:
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
def pause(name: NameArgument, url: UrlOption = None) -> None:
    """No more fires until resumed (a sweep under way carries on)."""
    with controller(url, token_needed=True) as client:
        client.schedule_action(name, "pause")
    typer.echo(f"schedule {name} paused")


@schedules_app.command("resume")
def resume(name: NameArgument, url: UrlOption = None) -> None:
    """Fire again from the next cron time (fires that fell in the pause are not run)."""
    with controller(url, token_needed=True) as client:
        nxt = client.schedule_action(name, "resume").next_fire_at
    typer.echo(f"schedule {name} resumed; next fire {nxt:%Y-%m-%d %H:%M} UTC")


@schedules_app.command("delete")
def delete(name: NameArgument, url: UrlOption = None) -> None:
    """Delete a schedule and its sweep history (refused while a sweep is under way)."""
    with controller(url, token_needed=True) as client:
        client.delete_schedule(name)
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
