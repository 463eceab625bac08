"""`ablate import CURVES --name NAME`: store recorded curves (ablate's curves JSON, a W&B CSV export or offline
runs, TensorBoard event files, a CSV of runs such as PRX's FID / CMMD / DINO-MMD curves) as a finished grid,
detector replayed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli import CLIError, app
from orchestrator.messages import database_error_text, masked_url, validation_text


def _arm_map(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, letter = pair.rpartition("=")  # the letter follows the last "=": a key may hold one
        if not sep or not key or not letter:
            raise CLIError(f"--arm {pair!r}: expected CURVE_KEY=ARM_LETTER, e.g. --arm baseline=A")
        out[key] = letter
    return out


@app.command("import")
def import_command(
    curves: Annotated[
        Path,
        typer.Argument(
            help="Curves JSON {arm: {label, start_time, checkpoints: [{step, ...}]}}, a W&B CSV export, a CSV of "
            "runs (columns run, step and one per metric: FID, CMMD, DINO-MMD as PRX publishes them), W&B offline "
            "runs (a run-*.wandb file or a folder of them) or TensorBoard event files (a file or a log directory)"
        ),
    ],
    name: Annotated[str, typer.Option("--name", help="Name of the new grid")],
    control: Annotated[
        str | None, typer.Option("--control", help="Control arm (curve key or letter; default: the first curve)")
    ] = None,
    arm: Annotated[
        list[str] | None,
        typer.Option("--arm", help="CURVE_KEY=LETTER for a curve not named after its arm (repeatable)"),
    ] = None,
    policy: Annotated[
        Path | None, typer.Option("--policy", help="DetectorPolicy YAML/JSON for every arm (default: each arm's spec)")
    ] = None,
) -> None:
    """Import recorded curves as a finished grid and replay the collapse detector over them.

    A study run elsewhere comes in from its tracker: each W&B or TensorBoard run is one curve named after
    the run (name runs after their arm, A_baseline, or map them with --arm). Distribution metrics (FID, CMMD,
    DINO-MMD) come in as fid, cmmd and dino_mmd, labelled as published; `--policy` with `metric: cmmd` replays
    the detector on CMMD. One run per curve (state
    completed, or stopped where the detector stops it, with its reason and best checkpoint), one metric
    row per checkpoint. Prints the grid id and each arm's verdict.
    """
    import json

    from pydantic import ValidationError
    from sqlalchemy.exc import SQLAlchemyError

    from orchestrator.cli.replay import load_policy
    from orchestrator.db.session import session_scope, upgrade
    from orchestrator.grids.service import GridError
    from orchestrator.results.curves import CurvesError, load_curves
    from orchestrator.results.importer import CurvesImportError, arm_letters, import_curves, start_times_of
    from orchestrator.settings import load_settings
    from orchestrator.trackers.exports import tracker_export_curves

    pol = load_policy(policy) if policy is not None else None
    try:
        exported = tracker_export_curves(curves)
        loaded = exported if exported is not None else load_curves(curves)
    except CurvesError as exc:
        raise CLIError(str(exc)) from None
    except OSError as exc:  # an unreadable export file or folder
        raise CLIError(f"cannot read {curves}: {exc.strerror or exc}") from None
    arm_map = _arm_map(arm or [])
    try:
        arm_letters(loaded, arm_map)  # fail on unmapped curves before touching the database
    except CurvesImportError as exc:
        raise CLIError(f"{curves}: {exc}") from None
    starts = start_times_of(json.loads(curves.read_text())) if exported is None else {}
    settings = load_settings()
    try:
        upgrade(settings.database_url)
        with session_scope(settings.database_url) as session:
            grid = import_curves(
                session,
                loaded,
                name,
                control=control,
                arm_map=arm_map,
                policy=pol,
                source=curves.name,
                start_times=starts,
            )
            rows = [(r.arm, r.state, r.decision, r.decision_step, r.best_step, r.best_value) for r in grid.runs]
            grid_id = grid.id
    except (CurvesImportError, GridError) as exc:
        raise CLIError(f"{curves}: {exc}") from None
    except ValidationError as exc:  # the grid record itself, e.g. a blank or over-long --name
        raise CLIError(f"invalid grid: {validation_text(exc, root='(grid)')}") from None
    except SQLAlchemyError as exc:
        raise CLIError(f"cannot write to {masked_url(settings.database_url)}: {database_error_text(exc)}") from None
    typer.echo(f"grid {grid_id} {name!r}: {len(rows)} arms imported from {curves}")
    for arm_name, state, decision, step, best_step, best_value in rows:
        best = f"best {best_value:.4f} @{best_step}" if best_value is not None else "no best"
        typer.echo(f"  {arm_name}: {state:<9} {decision} @{step}  ({best})")
