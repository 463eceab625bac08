"""`ablate plan`: the night plan of a grid file before it is submitted, and what-ifs on its projections."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.cli import CLIError, app
from orchestrator.cli.core import resolved_grid_file
from orchestrator.cli.plan_table import print_plan
from orchestrator.cli.remote import JsonOption, UrlOption, api_token, controller_url, print_json, said

if TYPE_CHECKING:
    from orchestrator.grids.projection import Rates

def parse_pairs(text: str | None, option: str, key_kind: str) -> dict[str, float]:
    """`A=3.2,B=1.5` as {"A": 3.2, "B": 1.5}; each value a positive number, else a CLIError naming it."""
    pairs: dict[str, float] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not sep or not key.strip() or not number > 0 or number == float("inf"):
            raise CLIError(f"{option}: {part.strip()!r} is not {key_kind}=NUMBER with a positive number, "
                           f"e.g. {option} {'A=6.66,B=3.2' if key_kind == 'ARM' else '2=2.04,4=3.98'}")
        pairs[key.strip()] = number
    return pairs


def controller_rates(gpu_model: str | None, url: str | None) -> Rates:
    """The rates the controller measured (GET /api/rates); none, with a note on stderr, where no controller
    answers: every cost is then the FLOP estimate or the --hours given."""
    from orchestrator.client import ApiError, Client
    from orchestrator.grids.projection import Rates

    base = controller_url(url)
    try:
        with Client(base, api_token()) as client:
            return client.rates(gpu_model)
    except ApiError as exc:
        typer.echo(f"no measured rates read ({said(exc, base)}): costs are the FLOP estimate or --hours",
                   err=True)
        return Rates(None, {})


@app.command()
def plan(
    grid_file: Annotated[Path, typer.Argument(help="YAML grid, as `ablate submit` takes it")],
    gpus: Annotated[int, typer.Option(min=1, max=64, help="GPUs of the one node to plan for")],
    seeds: Annotated[
        int | None, typer.Option(min=1, max=16, help="Training seeds per arm (overrides the file's)")
    ] = None,
    hours: Annotated[
        str | None, typer.Option(help="What-if: single-GPU hours per run of arms, e.g. A=6.66,B=3.2")
    ] = None,
    scaling: Annotated[
        str | None, typer.Option(help="What-if: speedup on G GPUs over one, e.g. 2=2.04,4=3.98")
    ] = None,
    gpu_model: Annotated[
        str | None, typer.Option(help="Whose measured rates to use (default: the GPU model most runs recorded)")
    ] = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Print the night plan: each run's GPUs, start and end, the night and its lower bound (total GPU-hours
    over GPUs). Runs take the GPU counts the plan chooses where the grid says `gpus_per_arm: auto`."""
    from orchestrator.grids.night import plan_grid
    from orchestrator.grids.projection import Rates

    _, body, resolved = resolved_grid_file(grid_file, seeds)
    given_hours = parse_pairs(hours, "--hours", "ARM")
    unknown = sorted(set(given_hours) - {label for label, _ in resolved})
    if unknown:
        raise CLIError(f"--hours: {', '.join(unknown)} is not an arm of {grid_file} "
                       f"(its arms: {', '.join(label for label, _ in resolved)})")
    given_scaling: dict[int, float] = {}
    for key, value in parse_pairs(scaling, "--scaling", "GPUS").items():
        if not key.isdigit() or int(key) < 2:
            raise CLIError(f"--scaling: {key!r} is not a GPU count of 2 or more, e.g. --scaling 2=2.04,4=3.98")
        given_scaling[int(key)] = value
    auto = body.gpus_per_arm == "auto"
    if not auto:
        typer.echo(f"{grid_file} names no gpus_per_arm: auto, so each arm keeps its own GPU count; "
                   "add it to let the plan choose", err=True)
    # Every run's hours given: the plan needs no measured rate, and no controller is asked.
    every_arm = {label for label, _ in resolved} <= set(given_hours)
    rates = Rates(None, {}) if every_arm else controller_rates(gpu_model, url)
    found = plan_grid(resolved, body.first_seeds(), {"node": gpus}, rates, auto,
                      hours=given_hours, scaling=given_scaling)
    assert found is not None  # one node of `gpus` >= 1
    if as_json:
        print_json(found)
        return
    print_plan(found)
