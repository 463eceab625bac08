"""`ablate evaluate GRID [--images N] [--samples N --metrics cmmd,fd_dinov2] [--step final|best|S]`: evaluate a
grid's stored checkpoints again on more held-out images and generated samples through the running server
(POST /api/grids/{id}/evaluations), wait with progress, print each run's result and what it cost."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from orchestrator.cli import CLIError, app
from orchestrator.cli.core import call, server

QUEUED_HINT_S = 60.0  # how long an evaluation waits queued before the command says why it may


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
    url: Annotated[str | None, typer.Option(help="Server URL (default: http://ABLATE_HOST:ABLATE_PORT)")] = None,
) -> None:
    """Evaluate every run's stored checkpoint of the grid again on N held-out images (the same per-image
    noise as training's evaluation, so the runs pair), one GPU job per run on the nodes, without a
    training step; the grid's report then uses the largest completed evaluation."""
    import httpx

    base, headers = server(url)
    resp = call(httpx.post, base, f"/api/grids/{grid_id}/evaluations", headers=headers,
                json={"images": images, "samples": samples, "metrics": _metrics(metrics),
                      "step": _step(step)})  # fmt: skip
    if resp.status_code == 404:
        raise CLIError(f"no grid with id {grid_id} on {base}")
    if resp.status_code == 422:
        detail = resp.json().get("detail", [])
        raise CLIError("; ".join(f"--{(e['loc'][1:] or ['body'])[0]}: {e['msg']}" for e in detail) or resp.text[:300])
    if resp.status_code != 202:
        raise CLIError(f"{base} answered {resp.status_code}: {resp.text[:200]}")
    eid = resp.json()["id"]
    asked = f", {samples} samples for {metrics}" if samples or metrics else ""
    typer.echo(f"evaluation {eid} of grid {grid_id} queued: {images or 'the runs eval.num_samples'} images{asked} "
               f"at step {step}")
    if not wait:
        return
    grid = call(httpx.get, base, f"/api/grids/{grid_id}", headers=headers).json()
    runs = {r["id"]: f"{r['arm']} s{r['seed']}" for r in grid.get("runs", [])}
    shown, asked_at, hinted = None, time.monotonic(), False
    while True:
        evaluation = call(httpx.get, base, f"/api/grids/{grid_id}/evaluations/{eid}", headers=headers).json()
        done = sum(1 for j in evaluation["runs"] if j["state"] == "completed")
        progress = (evaluation["state"], done)
        if progress != shown:
            shown = progress
            typer.echo(f"{evaluation['state']}: {done}/{len(evaluation['runs'])} runs evaluated", err=True)
        if evaluation["state"] in ("completed", "failed"):
            break
        if evaluation["state"] == "queued" and not hinted and time.monotonic() - asked_at > QUEUED_HINT_S:
            hinted = True  # the jobs run where `ablate serve`'s launcher finds a free GPU
            typer.echo("still queued: every GPU is busy, or no node is up (ablate status, ablate nodes list); "
                       "Ctrl-C leaves it to run on the server", err=True)
        time.sleep(2.0)
    if evaluation["state"] == "failed":
        raise CLIError(f"evaluation {eid} failed: {evaluation['error']}")
    typer.echo(f"evaluation {eid} completed in {evaluation['gpu_seconds']:.1f} GPU-seconds:")
    for line in _result_lines(evaluation, runs):
        typer.echo(line)
    for why in evaluation.get("skipped") or []:
        typer.echo(f"  skipped: {why}")
    typer.echo(f"the report (ablate report {grid_id}) now uses it for its effects")
