"""`ablate weights list` and `ablate weights fetch NAME`: the distribution metrics' extractor weights, pinned by
revision and sha256 (model/extractors/registry.py), staged in the checkpoint store so that a rented node with no
route to the Hugging Face hub loads hash-checked copies."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from orchestrator.cli import CLIError, app
from orchestrator.cli.tables import Column, print_table
from orchestrator.settings import load_settings

console = Console()
weights_app = typer.Typer(no_args_is_help=True,
                          help="Pinned weights of the distribution metrics' feature extractors (CMMD, FD-DINOv2).")
app.add_typer(weights_app, name="weights")


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


@weights_app.command("list")
def list_weights() -> None:
    """Each extractor's pinned files (repo, revision, sha256) and whether they are staged: on this machine
    (ABLATE_WEIGHTS_DIR) and in the checkpoint store (where nodes copy them from)."""
    from model.extractors.pinned_files import default_weights_dir, local_path, store_state
    from model.extractors.registry import EXTRACTORS

    settings = load_settings()
    store, local_dir = settings.checkpoint_root, default_weights_dir()
    rows = []
    for entry in EXTRACTORS.values():
        try:
            in_store = store_state(entry, store, settings.checkpoint_options)
        except Exception as exc:  # noqa: BLE001 - an unreachable store is a cell, not a traceback
            in_store = f"unknown ({type(exc).__name__})"
        for pinned in entry.files:
            path = local_path(entry, pinned, local_dir)
            here = "no" if not path.is_file() else "yes" if path.stat().st_size == pinned.size else "wrong size"
            rows.append([entry.name, entry.purpose, entry.repo, entry.revision, pinned.filename,
                         _size(pinned.size), pinned.sha256, here, in_store])
    columns = [
        Column("name"), Column("for", priority=3), Column("repo", priority=1), Column("revision", priority=2),
        Column("file", priority=2), Column("size", priority=3, justify="right"), Column("sha256", priority=1),
        Column("here", priority=1), Column("store"),
    ]
    print_table(f"extractor weights (here: {local_dir}; store: {store}/weights)", columns, rows, console)


@weights_app.command("fetch")
def fetch(name: Annotated[str, typer.Argument(help="An extractor, as `ablate weights list` names it")]) -> None:
    """Stage NAME's pinned files in the checkpoint store: from this machine's weights folder where they are
    (ABLATE_WEIGHTS_DIR), else downloaded from the hub at the pinned revision; every file's sha256 is checked
    before it is staged. Offline (ABLATE_OFFLINE=1, or no route to the hub) it says where to put the files."""
    from model.extractors.pinned_files import (
        ExtractorWeightsError,
        WeightsHashError,
        default_weights_dir,
        download_from_hub,
        resolve_weights,
        stage_in_store,
        store_state,
    )
    from model.extractors.registry import UnknownExtractor, extractor_entry

    settings = load_settings()
    store, options = settings.checkpoint_root, settings.checkpoint_options
    try:
        entry = extractor_entry(name)
    except UnknownExtractor as exc:
        raise CLIError(str(exc)) from None
    local_dir = default_weights_dir()
    try:
        state = store_state(entry, store, options)
        if state == "staged":
            typer.echo(f"{entry.name}: already staged in {store}/weights/{entry.name}/ (nodes check each file's "
                       "sha256 before use)")
            return
        fetched = download_from_hub(entry, local_dir)  # only the files not already here
        resolve_weights(entry, local_dir)  # every file here and the pinned one
        written = stage_in_store(entry, local_dir, store, options)
    except (ExtractorWeightsError, WeightsHashError) as exc:
        raise CLIError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - a store that is down or refuses a write, a full disk: one line
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise CLIError(f"{entry.name}: staging in {store} failed ({type(exc).__name__}: {first})") from None
    source = f"downloaded from {entry.repo}@{entry.revision[:12]}" if fetched else f"from {local_dir / entry.name}"
    replaced = " (replacing a corrupt file there)" if state == "corrupt" else ""
    typer.echo(f"{entry.name}: {len(written)} file(s) ({_size(entry.weights_bytes)}) {source}, sha256-checked, "
               f"staged in {store}/weights/{entry.name}/{replaced}")
