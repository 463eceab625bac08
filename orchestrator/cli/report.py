"""`ablate report GRID_ID [--out DIR]`: write a grid's report (JSON, Markdown, self-contained HTML) as the
controller renders it (GET /api/grids/{id}/report.{json,md,html})."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli import CLIError, app
from orchestrator.cli.remote import UrlOption, controller


@app.command("report")
def report_command(
    grid_id: Annotated[int, typer.Argument(help="The grid's id (ablate status / the dashboard)")],
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Folder for report.{json,md,html} (default: home_dir/reports/grid-ID)"),
    ] = None,
    url: UrlOption = None,
) -> None:
    """Write the grid's report: each arm's effect against its parent and the control with 95% intervals,
    the detector's stops, throughput and cost, samples; a live grid gives a report of where it stands."""
    from orchestrator.client import ApiError
    from orchestrator.results.reports.render import RENDERERS
    from orchestrator.results.reports.write import report_dir, write_texts
    from orchestrator.settings import load_settings

    target = out if out is not None else report_dir(load_settings(), grid_id)
    with controller(url) as client:
        try:
            texts = {fmt: client.report_text(grid_id, fmt) for fmt in RENDERERS}
        except ApiError as exc:
            if exc.status in (404, 422):
                raise CLIError(f"no grid with id {grid_id} on {client.url}; `ablate status` lists them") from None
            raise
    try:
        paths = write_texts(texts, target)
    except OSError as exc:
        raise CLIError(f"cannot write the report to {target}: {exc} (choose another --out)") from None
    for path in paths:
        typer.echo(str(path))
