"""`ablate model-info ARM [--size S]`: the NanoDiT parameter count of an arm, as JSON."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from orchestrator.cli import CLIError, app


@app.command("model-info")
def model_info(
    arm: Annotated[str, typer.Argument(help="Arm letter (A..I)")],
    size: Annotated[str | None, typer.Option(help="Model size: seed, small or tiny (default: the arm's)")] = None,
    text_dim: Annotated[int, typer.Option(help="Width of the text encoder's token states")] = 768,
) -> None:
    """Print JSON with `params` (total) and the per-module breakdown; built on the meta device (no memory)."""
    import torch

    from model.nanodit import NanoDiT, count_params
    from model.spec import SIZES
    from orchestrator.grids.arms import resolve

    if size is not None and size not in SIZES:
        raise CLIError(f"--size must be one of {', '.join(SIZES)}, not {size!r}")
    if text_dim <= 0:
        raise CLIError(f"--text-dim must be positive, not {text_dim}")
    spec = resolve(arm, {"model": {"size": size}} if size else None)
    with torch.device("meta"):
        model = NanoDiT(spec, text_dim)
    info = {"arm": spec.name, "size": spec.model.size, "text_dim": text_dim, **spec.model.dims().model_dump()}
    info |= count_params(model)
    typer.echo(json.dumps(info, indent=2))
