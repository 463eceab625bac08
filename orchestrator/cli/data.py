"""`ablate data prepare SRC --resolution R --out DIR`: decode a dataset once into uint8 shards at the
training resolution (model/data/prepare.py), so training reads them memory-mapped with no decoding.

SRC: a folder with captions.jsonl, a Hugging Face imagefolder (metadata.jsonl / metadata.csv), or a
directory of WebDataset *.tar shards. Interrupted, the same command resumes; unreadable inputs are
listed and the rest prepared, unless more than --max-unreadable of them are unreadable (the share a run
allows, data.max_unreadable): then it exits 2 naming the first ten. Train from DIR with
`data: {dataset: prepared, path: DIR}`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from model.spec import MAX_UNREADABLE
from orchestrator.cli import CLIError, app

data_app = typer.Typer(no_args_is_help=True, help="Datasets: prepare shards at the training resolution.")
app.add_typer(data_app, name="data")

SHOWN_SKIPS = 20  # unreadable inputs printed; the manifest lists every one


@data_app.command("prepare")
def prepare_cmd(
    src: Annotated[Path, typer.Argument(help="Folder (captions.jsonl or HF metadata) or directory of *.tar shards")],
    resolution: Annotated[int, typer.Option(help="Training resolution in pixels (the arm's data.resolution)")],
    out: Annotated[Path, typer.Option(help="Output directory for the shards and manifest.json")],
    caption_column: Annotated[
        str | None, typer.Option(help="metadata.jsonl / .csv: the caption column (default: caption, else text)")
    ] = None,
    max_unreadable: Annotated[
        float,
        typer.Option(help="Share of SRC's images that may be unreadable (left out, listed); past it, exit 2"),
    ] = MAX_UNREADABLE,
) -> None:
    """Prepare SRC into OUT: uint8 shards, captions, a manifest with counts and sha256 checksums."""
    from model.data import DatasetError
    from model.data.prepare import prepare
    from model.spec import MAX_RESOLUTION

    if not 0 < resolution <= MAX_RESOLUTION:
        raise CLIError(f"--resolution must be in 1..{MAX_RESOLUTION}, not {resolution}")
    if not 0 <= max_unreadable <= 1:
        raise CLIError(f"--max-unreadable is a share of the images, 0..1 (0.01 = 1%), not {max_unreadable}")
    console = Console(stderr=True)
    columns = (TextColumn("[bold]prepare"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("prepare", total=None)
        try:
            res = prepare(
                src,
                out,
                resolution,
                caption_column=caption_column,
                max_unreadable=max_unreadable,
                on_item=lambda done, total: bar.update(task, completed=done, total=total),
            )
        except DatasetError as exc:
            raise CLIError(str(exc)) from None
    for line in res.skipped[:SHOWN_SKIPS]:
        console.print(f"[yellow]skipped[/] {line}", highlight=False)
    if len(res.skipped) > SHOWN_SKIPS:
        console.print(f"... and {len(res.skipped) - SHOWN_SKIPS} more (all in {out / 'manifest.json'})")
    reused = f", {res.reused_shards} reused from an earlier run" if res.reused_shards else ""
    typer.echo(
        f"prepared {res.count} images in {res.shards} shards at {resolution} px into {out}{reused}; "
        f"{len(res.skipped)} unreadable skipped. Train with data: {{dataset: prepared, path: {out}}}"
    )
