"""`ablate events`: what happened to runs, grids, sweeps and nodes, newest first (node.command with its
exit code, node.install_skipped, node.refused, started, checkpoint.stored, ...). Reads the database directly
(ABLATE_DATABASE_URL), like `ablate status`; GET /api/events is the same list over REST."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli import app, migrated_database_url, service_errors
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
) -> None:
    """Events newest first: a node's commands (exit code, output), its installs and refusals, runs'
    starts, checkpoints and storage."""
    import json

    from sqlalchemy import select

    from orchestrator.db.events import list_events
    from orchestrator.db.models import Node
    from orchestrator.db.session import session_scope
    from orchestrator.fleet.inventory import get_node

    rows = []
    with service_errors(), session_scope(migrated_database_url()) as session:
        row = get_node(session, node) if node is not None else None
        names = {n.id: n.name for n in session.scalars(select(Node))}
        for e in list_events(session, node=row, run_id=run, grid_id=grid, kind=kind, limit=limit):
            where = names.get(e.node_id or -1) or (e.data or {}).get("node_name") or ""
            if e.run_id is not None:
                where = f"{where} run {e.run_id}".strip()
            message = e.message if full else e.message.splitlines()[0][:MESSAGE_CHARS] if e.message else ""
            if full and e.data:
                message += "\n" + json.dumps(e.data, indent=1, default=str)
            rows.append([str(e.id), f"{e.time:%Y-%m-%d %H:%M:%S}", e.kind, where or "-", message])
    print_table("events (newest first)", COLUMNS, rows, show_lines=full)
