"""`ablate report GRID_ID [--out DIR]`: write a grid's report (JSON, Markdown, self-contained HTML)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli import CLIError, app


@app.command("report")
def report_command(
    grid_id: Annotated[int, typer.Argument(help="The grid's id (ablate grids / the dashboard)")],
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Folder for report.{json,md,html} (default: home_dir/reports/grid-ID)"),
    ] = None,
) -> None:
    """Write the grid's report: each arm's effect against its parent and the control with 95% intervals,
    the detector's stops, throughput and cost, samples; a live grid gives a report of where it stands."""
    from sqlalchemy.exc import SQLAlchemyError

    from orchestrator.db.models import Grid
    from orchestrator.db.session import session_scope, upgrade
    from orchestrator.messages import database_error_text, masked_url
    from orchestrator.results.reports.write import report_dir, write_report
    from orchestrator.settings import load_settings

    settings = load_settings()
    target = out if out is not None else report_dir(settings, grid_id)
    try:
        upgrade(settings.database_url)
        with session_scope(settings.database_url) as session:
            grid = session.get(Grid, grid_id) if 1 <= grid_id <= 2**31 - 1 else None
            if grid is None:
                raise CLIError(f"no grid with id {grid_id} in {masked_url(settings.database_url)}")
            paths = write_report(session, grid, target, settings.checkpoint_options)
    except SQLAlchemyError as exc:
        raise CLIError(f"cannot read {masked_url(settings.database_url)}: {database_error_text(exc)}") from None
    except OSError as exc:
        raise CLIError(f"cannot write the report to {target}: {exc} (choose another --out)") from None
    for path in paths:
        typer.echo(str(path))
