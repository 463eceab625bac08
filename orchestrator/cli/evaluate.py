"""`ablate evaluate GRID [--images N] [--samples N --metrics cmmd,fd_dinov2] [--step final|best|S]`: evaluate a
grid's stored checkpoints again on more held-out images and generated samples through the running server
(POST /api/grids/{id}/evaluations), wait with progress and why it waits, print each run's result and what it
cost. `--cancel EID` cancels one (DELETE /api/grids/{id}/evaluations/{eid})."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from orchestrator.cli import CLIError, app
from orchestrator.cli.remote import UrlOption, controller, send

if TYPE_CHECKING:
    from orchestrator.client import Client
    from orchestrator.results.evaluations import EvaluationView

POLL_S = 2.0


def _step(text: str) -> str | int:
    if text in ("final", "best"):
        return text
    if text.isdigit():
        return int(text)
    raise CLIError(f"--step {text!r}: give final, best or a step number")


def _metrics(text: str | None) -> list[str] | None:
    return None if text is None else [m.strip() for m in text.split(",") if m.strip()]


def _value(job: dict[str, Any], metric: str) -> str:
    value, se, n = job.get(metric), job.get(f"{metric}_se"), job.get(f"{metric}_n")
    return "-" if value is None else f"{value:.4f}" + (f" ± {se:.4f}" if se is not None else "") + f" (n={n})"


def _result_lines(evaluation: dict[str, Any], runs: dict[int, str]) -> list[str]:
    lines = []
    for job in (j for j in evaluation["runs"] if j["state"] != "skipped"):  # the skipped: their reasons, after
        dist = job.get("distribution") or {}
        asked = evaluation.get("metrics") or []
        shown = "".join(f", {m} {_value(dist, m)} [{dist.get(f'{m}_extractor')}]" for m in asked)
        lines.append(f"  {runs.get(job['run_id'], job['run_id'])}: step {job['step']}, held-out flow loss "
                     f"{_value(job, 'val_flow_loss')}{shown}")  # fmt: skip
    return lines


@app.command("evaluate")
def evaluate_command(
    grid_id: Annotated[int, typer.Argument(help="The grid's id (ablate status)")],
    images: Annotated[int | None, typer.Option("--images", help="Held-out images to evaluate on (at most "
                                               "data.held_out; default the runs' eval.num_samples)")] = None,
    samples: Annotated[int | None, typer.Option("--samples", help="Generated samples for the distribution "
                                                "metrics (at most data.held_out)")] = None,
    metrics: Annotated[str | None, typer.Option("--metrics", help="Distribution metrics, comma-separated: cmmd, "
                                                "dino_mmd, fd_dinov2 (default: the runs' eval.distribution)")] = None,
    step: Annotated[str, typer.Option("--step", help="final, best, or a step every run keeps")] = "final",
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait for the result, with progress")] = True,
    cancel: Annotated[int | None, typer.Option("--cancel", metavar="EVALUATION_ID",
                                               help="Cancel this evaluation of the grid instead")] = None,
    url: UrlOption = None,
) -> None:
    """Evaluate every run's stored checkpoint of the grid again on N held-out images (the same per-image
    noise as training's evaluation, so the runs pair), one GPU job per run on the nodes, without a
    training step; the grid's report then uses the largest completed evaluation."""
    with controller(url, token_needed=True) as client:
        if cancel is not None:
            ended = client.cancel_evaluation(grid_id, cancel)
            typer.echo(f"evaluation {ended.id} of grid {grid_id}: {ended.error}")
            return
        body = {"images": images, "samples": samples, "metrics": _metrics(metrics), "step": _step(step)}
        base, resp = send("POST", f"/api/grids/{grid_id}/evaluations", url, json=body)
        if resp.status_code == 404:
            raise CLIError(f"no grid with id {grid_id} on {base}")
        if resp.status_code == 422:  # each field as its option: --samples: ...
            detail = resp.json().get("detail", [])
            raise CLIError("; ".join(f"--{(e['loc'][1:] or ['body'])[0]}: {e['msg']}" for e in detail)
                           or resp.text[:300])
        if resp.status_code != 202:
            raise CLIError(f"{base} answered {resp.status_code}: {resp.text[:200]}")
        eid = resp.json()["id"]
        asked = f", {samples} samples for {metrics}" if samples or metrics else ""
        typer.echo(f"evaluation {eid} of grid {grid_id} queued: {images or 'the runs eval.num_samples'} images"
                   f"{asked} at step {step}; `ablate evaluate {grid_id} --cancel {eid}` cancels it")
        if not wait:
            return
        runs = {r.id: f"{r.arm} s{r.seed}" for r in client.grid(grid_id).runs}
        evaluation = _follow(client, grid_id, eid)
    if evaluation.state == "failed":
        raise CLIError(f"evaluation {eid} failed: {evaluation.error}")
    typer.echo(f"evaluation {eid} completed in {evaluation.gpu_seconds:.1f} GPU-seconds:")
    for line in _result_lines(evaluation.model_dump(), runs):
        typer.echo(line)
    for why in evaluation.get("skipped") or []:
        typer.echo(f"  skipped: {why}")
    typer.echo(f"the report (ablate report {grid_id}) now uses it for its effects")


def _follow(client: Client, grid_id: int, eid: int) -> EvaluationView:
    """Poll until it ends: its progress, and why it waits as soon as the controller says, on stderr."""
    shown: tuple[str, int, str | None] | None = None
    while True:
        evaluation = client.evaluation(grid_id, eid)
        done = sum(1 for j in evaluation.runs if j.state == "completed")
        # Why it waits, while nothing of it runs: no node up, no GPUs, every GPU busy.
        waiting = evaluation.waiting if evaluation.state == "queued" else None
        progress = (evaluation.state, done, waiting)
        if progress != shown:
            shown = progress
            why = f" ({waiting})" if waiting else ""
            typer.echo(f"{evaluation.state}: {done}/{len(evaluation.runs)} runs evaluated{why}", err=True)
        if evaluation.state in ("completed", "failed"):
            return evaluation
        time.sleep(POLL_S)
