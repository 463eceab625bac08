"""`ablate import CURVES --name NAME`: store recorded curves (ablate's curves JSON, a W&B CSV export or offline
runs, TensorBoard event files, a CSV of runs such as PRX's FID / CMMD / DINO-MMD curves) as a finished grid,
detector replayed.

The file is read here, in whichever format it is, and its curves are sent to the controller's POST
/api/grids/import (ABLATE_URL or --url, the token), which stores the grid.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from orchestrator.cli import CLIError, app
from orchestrator.cli.remote import UrlOption, controller

if TYPE_CHECKING:
    from orchestrator.api.schemas import GridDetail
    from orchestrator.results.curves import Curve

IMPORT_TIMEOUT_S = 600.0  # the controller replays the detector and stores every checkpoint before it answers


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
    url: UrlOption = None,
) -> None:
    """Import recorded curves as a finished grid and replay the collapse detector over them.

    A study run elsewhere comes in from its tracker: each W&B or TensorBoard run is one curve named after
    the run (name runs after their arm, A_baseline, or map them with --arm). Distribution metrics (FID, CMMD,
    DINO-MMD) come in as fid, cmmd and dino_mmd, labelled as published; `--policy` with `metric: cmmd` replays
    the detector on CMMD. One run per curve (state
    completed, or stopped where the detector stops it, with its reason and best checkpoint), one metric
    row per checkpoint. The controller stores it (POST /api/grids/import). Prints the grid id and each
    arm's verdict.
    """
    import json

    from orchestrator.cli.replay import load_policy
    from orchestrator.results.curves import CurvesError, load_curves
    from orchestrator.results.importer import CurvesImportError, arm_letters, start_times_of
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
        arm_letters(loaded, arm_map)  # unmapped curves fail here, before anything is sent
    except CurvesImportError as exc:
        raise CLIError(f"{curves}: {exc}") from None
    starts = start_times_of(json.loads(curves.read_text())) if exported is None else {}
    body = {
        "name": name,
        "curves": _document(loaded, starts),
        "control": control,
        "arms": arm_map,
        "policy": pol.model_dump(mode="json") if pol is not None else None,
        "source": curves.name,
    }
    grid = _send(body, curves, url)
    typer.echo(f"grid {grid.id} {name!r}: {len(grid.runs)} arms imported from {curves}")
    for r in grid.runs:
        best = f"best {r.best_value:.4f} @{r.best_step}" if r.best_value is not None else "no best"
        typer.echo(f"  {r.arm}: {r.state:<9} {r.decision} @{r.decision_step}  ({best})")


def _document(curves: dict[str, Curve], starts: dict[str, str]) -> dict[str, Any]:
    """The curves in ablate's curves JSON schema, whatever format they were read from: what the API takes."""
    doc: dict[str, Any] = {}
    for key, curve in curves.items():
        doc[key] = {"label": curve.label, "checkpoints": list(curve.raw)}
        if key in starts:
            doc[key]["start_time"] = starts[key]
    return doc


def _send(body: dict[str, Any], curves: Path, url: str | None) -> GridDetail:
    """POST /api/grids/import; what the controller refuses names the file, then the field."""
    from orchestrator.cli.tables import terminal_safe
    from orchestrator.client import ApiError

    with controller(url, token_needed=True, timeout=IMPORT_TIMEOUT_S) as client:
        try:
            return client.import_curves(body)
        except ApiError as exc:
            if exc.status == 413:
                raise CLIError(f"{curves}: its curves are more than the controller takes in one request "
                               f"(ABLATE_MAX_BODY_BYTES on the controller)") from None
            if exc.status != 422:
                raise  # unreachable, a rejected token: the controller's own one line
            raise CLIError(f"{curves}: {terminal_safe(exc.message)}") from None
