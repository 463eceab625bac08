"""`ablate train ARM`: train one arm locally with a progress bar and a per-checkpoint table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from model.spec import STANDIN
from orchestrator.cli import CLIError, app
from orchestrator.numbers import number

SIZES = ["tiny", "small", "seed"]

# Tiny runs: CPU-sized defaults so `ablate train A --size tiny --steps 300` shows falling loss and
# improving recon LPIPS in a few minutes on 2 cores. EMA decay 0.99 (not 0.9999): a 300-step run
# would otherwise evaluate weights from its first 50 steps.
TINY_OVERRIDES: dict[str, Any] = {
    "model": {"size": "tiny"},
    "data": {"num_images": 2048, "held_out": 16},
    "schedule": {
        "steps": 300,
        "batch_size": 32,
        "warmup_steps": 30,
        "lr": 1e-3,
        "checkpoint_every": 50,
        "ema": {"warmup_steps": 50, "decay": 0.99},
    },
    "eval": {"num_samples": 16, "sampler_steps": 10},
}

TABLE_COLUMNS = [
    ("step", "step", "d"),
    ("train_loss", "loss", ".4f"),
    ("lr", "lr", ".1e"),
    ("recon_lpips", "recon", ".4f"),
    ("recon_lpips_se", "±se", ".4f"),
    ("text_lpips", "text", ".4f"),
    ("text_manip_delta", "manip", ".4f"),
    ("iter_per_sec", "it/s", ".1f"),
    ("wall_time_s", "wall s", ".0f"),
]


def build_spec(
    arm: str,
    size: str,
    steps: int | None,
    checkpoint_every: int | None,
    batch_size: int | None,
    lpips_standin: bool,
    repa_standin: bool,
    lpips_weights: Path | None,
) -> Any:
    """The arm resolved through its parents, with the size's defaults and the flags on top."""
    from orchestrator.grids.arms import deep_merge, resolve

    over: dict[str, Any] = TINY_OVERRIDES if size == "tiny" else {"model": {"size": size}}
    sched: dict[str, Any] = {}
    if steps is not None:
        sched["steps"] = steps
    if checkpoint_every is not None:
        sched["checkpoint_every"] = checkpoint_every
    if batch_size is not None:
        sched["batch_size"] = batch_size
    extra: dict[str, Any] = {"schedule": sched}
    if lpips_standin:
        extra["eval"] = {"lpips_backbone": STANDIN}
    if lpips_weights is not None:
        extra.setdefault("eval", {})["lpips_weights"] = str(lpips_weights)
    if repa_standin:
        extra["repa"] = {"teacher": STANDIN}
    return resolve(arm, deep_merge(over, extra))


@app.command("train")
def train(
    arm: Annotated[str, typer.Argument(help="arm letter (A-I), resolved through its parents")],
    size: Annotated[str, typer.Option(help=f"model size: {', '.join(SIZES)}")] = "tiny",
    steps: Annotated[int | None, typer.Option(min=1, help="optimizer steps (tiny default 300)")] = None,
    checkpoint_every: Annotated[int | None, typer.Option(min=1, help="evaluate + checkpoint interval")] = None,
    batch_size: Annotated[int | None, typer.Option(min=1, help="global batch per step")] = None,
    out: Annotated[Path | None, typer.Option(help="run directory (default runs/train-ARM-SIZE); resumes")] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N")] = "cpu",
    lpips_standin: Annotated[
        bool,
        typer.Option("--lpips-standin", help="LPIPS with the labelled random stand-in backbone (no AlexNet weights)"),
    ] = False,
    lpips_weights: Annotated[Path | None, typer.Option(help="local torchvision AlexNet state dict for LPIPS")] = None,
    repa_standin: Annotated[
        bool, typer.Option("--repa-standin", help="REPA with the labelled random stand-in teacher")
    ] = False,
    threads: Annotated[
        int, typer.Option(min=0, help="torch intra-op threads (0 = 1 for tiny on CPU, else torch's default)")
    ] = 0,
) -> None:
    """Train one arm locally: progress bar, a table row per checkpoint, DIR/metrics.jsonl."""
    if size not in SIZES:
        raise CLIError(f"--size must be one of {', '.join(SIZES)}, not {size!r}")
    spec = build_spec(arm, size, steps, checkpoint_every, batch_size, lpips_standin, repa_standin, lpips_weights)
    out_dir = out or Path("runs") / f"train-{spec.name}-{size}"

    import torch
    from rich import box
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from model.data import DatasetError
    from model.perceptual import LPIPSWeightsError
    from model.precision import PrecisionError
    from model.repa import TeacherError
    from model.text import TextEncoderError
    from worker.checkpoint import latest_checkpoint
    from worker.run_files import METRICS_NAME
    from worker.train import TrainError, train_arm

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CLIError(f"--device {device}: CUDA is not available on this machine; use --device cpu")
    if not threads and size == "tiny" and device == "cpu":
        # Tiny shapes gain little from a second thread, and OpenMP spin-waiting collapses (10x slower
        # measured here) when other processes share the cores.
        threads = 1
    if threads:
        torch.set_num_threads(threads)
    console = Console()
    resume = latest_checkpoint(out_dir) if out_dir.exists() else None
    console.print(
        f"arm {spec.name} ({spec.description}) size {size}, {spec.schedule.steps} steps, batch "
        f"{spec.schedule.batch_size}, {spec.resolution()} px, device {device} "
        f"({torch.get_num_threads()} threads) -> {out_dir}"
        + (f" (resuming from {resume.name})" if resume else "")
    )
    table = Table(title=f"arm {spec.name}", box=box.SIMPLE)
    for _, title, _ in TABLE_COLUMNS:
        table.add_column(title, justify="right", no_wrap=True)
    records: list[dict[str, Any]] = []
    progress = Progress(
        TextColumn("[bold]train {task.fields[arm]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
        console=console,
    )
    try:
        with progress:
            task = progress.add_task("train", total=spec.schedule.steps, arm=spec.name, loss="-")

            def on_step(step: int, loss: float) -> None:
                progress.update(task, completed=step, loss=f"{loss:.4f}")

            for rec in train_arm(spec, out_dir, device=device, lpips_weights=lpips_weights, on_step=on_step):
                records.append(rec)
                progress.update(task, completed=rec["step"])
                progress.console.print(
                    "  ".join(f"{title} {number(rec.get(key), pat)}" for key, title, pat in TABLE_COLUMNS)
                )
    except LPIPSWeightsError as exc:
        raise CLIError(f"{exc} (here: --lpips-weights FILE or --lpips-standin)") from None
    except TeacherError as exc:
        raise CLIError(f"{exc} (here: --repa-standin)") from None
    except (PrecisionError, DatasetError, TextEncoderError, TrainError) as exc:
        raise CLIError(str(exc)) from None
    for rec in records:
        table.add_row(*(number(rec.get(key), pat) for key, _, pat in TABLE_COLUMNS))
    console.print(table)
    if records:
        last = records[-1]
        console.print(
            f"lpips backbone: {last.get('lpips_backbone')}; device: {last.get('device_name')}; "
            f"fallbacks: {json.dumps(last.get('fallbacks') or [])}; best: step {last.get('best_step')} "
            f"({last.get('best_checkpoint')})"
        )
    console.print(f"metrics: {out_dir / METRICS_NAME}")
