"""`ablate replay CURVES.json`: run the collapse detector over recorded curves, one JSON line per arm."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from model.spec import DetectorPolicy
from orchestrator.cli import CLIError, app


def load_policy(path: Path | None) -> DetectorPolicy:
    """A DetectorPolicy from a YAML/JSON file: the policy's fields at top level, or under `detector:`
    (so an arm file's section can be passed as is). None = the default policy."""
    import yaml
    from pydantic import ValidationError

    from orchestrator.messages import validation_text, yaml_error_text

    if path is None:
        return DetectorPolicy()
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise CLIError(f"policy file {str(path)!r} not found") from None
    except yaml.YAMLError as exc:
        raise CLIError(f"policy file {str(path)!r} is not valid YAML/JSON: {yaml_error_text(exc)}") from None
    if data is None:
        data = {}
    if isinstance(data, dict) and set(data) == {"detector"}:
        data = data["detector"]
    if not isinstance(data, dict):
        raise CLIError(f"policy file {str(path)!r}: expected a mapping of DetectorPolicy fields")
    try:
        return DetectorPolicy.model_validate(data)
    except ValidationError as exc:
        raise CLIError(f"policy file {str(path)!r}: {validation_text(exc, root='(policy)')}") from None


@app.command("replay")
def replay_command(
    curves: Annotated[Path, typer.Argument(help="Curves JSON: {arm: {label, checkpoints: [{step, ...}]}}")],
    policy: Annotated[
        Path | None, typer.Option("--policy", help="DetectorPolicy YAML/JSON (default: the built-in)")
    ] = None,
    control: Annotated[
        str | None, typer.Option("--control", help="Arm key to check the others for stalls against")
    ] = None,
) -> None:
    """Replay curves checkpoint by checkpoint through the collapse detector.

    Prints one JSON object per arm: arm, decision, step_flagged (null when it ran to the end),
    best_step, best_value, reason, gpu_hours_saved (elapsed hours after the stop), stopped, warnings.
    """
    from orchestrator.results.curves import CurvesError, load_curves
    from orchestrator.runs.detector import replay

    pol = load_policy(policy)
    try:
        loaded = load_curves(curves)
    except CurvesError as exc:
        raise CLIError(str(exc)) from None
    if control is not None and control not in loaded:
        raise CLIError(f"--control {control!r} is not an arm in {curves} (arms: {', '.join(loaded)})")
    for result in replay({arm: c.checkpoints for arm, c in loaded.items()}, pol, control):
        typer.echo(json.dumps(result.to_json()))
