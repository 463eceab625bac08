"""`ablate stop RUN_ID...` and `ablate stop --grid GRID_ID`: stop runs through the running server, gracefully
(queued runs at once; running ones at their next step, a checkpoint kept), one line per run saying what
happened. Stopping what ended or is being stopped already is no error; an unknown id is one line."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli import CLIError, app
from orchestrator.cli.remote import UrlOption, controller_url, required_token, said


@app.command("stop")
def stop_command(
    run_ids: Annotated[
        list[int] | None, typer.Argument(metavar="RUN_ID...", help="Runs to stop (ablate status shows their ids)")
    ] = None,
    grid: Annotated[int | None, typer.Option("--grid", help="Stop every run of this grid")] = None,
    url: UrlOption = None,
) -> None:
    """Stop runs as POST /api/runs/{id}/stop does: a queued run at once, a running one at its next step with
    its checkpoint kept. With --grid, every run of the grid (POST /api/grids/{id}/stop)."""
    from orchestrator.client import ApiError, Client

    if not run_ids and grid is None:
        raise CLIError("stop what? give run ids (ablate stop 12 13) or a grid (ablate stop --grid 3)")
    base, token = controller_url(url), required_token()
    unknown: list[str] = []
    with Client(base, token) as client:
        targets: list[tuple[int | None, int | None]] = [(None, grid)] if grid is not None else []
        for run_id, grid_id in [*targets, *((r, None) for r in run_ids or [])]:
            try:
                done = client.stop(run_ids=[run_id] if run_id is not None else [], grid=grid_id)
            except ApiError as exc:
                if exc.status == 404:  # the others are still stopped; this id is named at the end
                    unknown.append(exc.message)
                    continue
                raise CLIError(said(exc, base)) from None
            for run in done:
                typer.echo(f"run {run.run_id} ({run.arm} s{run.seed}): {run.message}")
    if unknown:
        raise CLIError(f"{'; '.join(unknown)} on {base}")
