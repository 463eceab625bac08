"""`ablate events`: what happened to runs, grids, sweeps and nodes, newest first (node.command with its
exit code, node.install_skipped, node.refused, started, checkpoint.stored, ...), as the controller's
GET /api/events lists them (the token)."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli import app
from orchestrator.cli.remote import JsonOption, UrlOption, controller, print_json
from orchestrator.cli.tables import Column, print_table

COLUMNS = [
    Column("id", justify="right", priority=3),
    Column("time (UTC)"),
    Column("kind"),
    Column("node / run", priority=1),
    Column("message"),
]
MESSAGE_CHARS = 200  # of each message; `--full` prints whole messages and the event's data


@app.command()
def events(
    node: Annotated[str | None, typer.Option(help="Only this registered node's events (and its runs' starts)")] = None,
    run: Annotated[int | None, typer.Option(help="Only this run's events")] = None,
    grid: Annotated[int | None, typer.Option(help="Only this grid's events")] = None,
    kind: Annotated[str | None, typer.Option(help='Only this kind, or a prefix ending in "." (node.)')] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="How many, newest first")] = 50,
    full: Annotated[bool, typer.Option(help="Whole messages, with each event's data")] = False,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Events newest first: a node's commands (exit code, output), its installs and refusals, runs'
    starts, checkpoints and storage."""
    import json

    with controller(url, token_needed=True) as client:
        found = client.events(node=node, run=run, grid=grid, kind=kind, limit=limit)
        if as_json:
            print_json(found)
            return
        names = {n.id: n.name for n in client.nodes()} if any(e.node_id is not None for e in found) else {}
    rows = []
    for e in found:
        where = names.get(e.node_id or -1) or (e.data or {}).get("node_name") or ""
        if e.run_id is not None:
            where = f"{where} run {e.run_id}".strip()
        message = e.message if full else e.message.splitlines()[0][:MESSAGE_CHARS] if e.message else ""
        if full and e.data:
            message += "\n" + json.dumps(e.data, indent=1, default=str)
        rows.append([str(e.id), f"{e.time:%Y-%m-%d %H:%M:%S}", e.kind, where or "-", message])
    print_table("events (newest first)", COLUMNS, rows, show_lines=full)
