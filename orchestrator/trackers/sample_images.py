"""A checkpoint's sample images as the trackers get them: bounded before anything decodes a pixel.

A node wrote these PNGs and its manifest names them, so each is a stranger's file: the manifest's names are
taken once each and at most MAX_IMAGES of them, each read through results/samples.py (a regular file in the
run's folder, at most 16 MiB, a PNG by its chunks), and then its header's width and height are checked
against the side this arm's trainer draws (a built-in arm: the smaller of SAMPLE_MAX_SIDE and its resolution;
a command arm's own pictures: OWN_MAX_SIDE). An 8000x8000 all-black PNG is a few KB on disk and 192 MB of
pixels; it is left out by its header, never decoded. A file that cannot be read (refused, or its storage
unreachable) is left out too. What is left out is named, with why, for the run's events; the checkpoint's
numbers and its other images go out without it.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from orchestrator.db.models import Run
from orchestrator.results.judge import stored_spec
from orchestrator.trackers.base import SampleImage
from worker.run_files import SAMPLE_MAX_SIDE, sample_dir
from worker.stored_file import StoredFileRefused

MAX_IMAGES = 64  # per checkpoint, as a command arm's gallery shows (worker/command.py MAX_SAMPLES)
MAX_BYTES = 32 << 20  # per checkpoint, all images together: what one checkpoint holds in the controller
OWN_MAX_SIDE = 2048  # a command arm's own PNGs: its spec says nothing of their size
# Per checkpoint, all images' pixels together: what a sink decodes (W&B holds every image of a checkpoint
# decoded at once: 64 of 2048x2048, 1.3 MiB as PNGs, took 1 GiB). 16 of a command arm's largest.
MAX_PIXELS = 16 * OWN_MAX_SIDE**2
NAMED_MAX = 5  # left-out files named in one event; the rest counted


@dataclass
class CheckpointImages:
    """What one checkpoint sends (`images`) and what it left out (`left_out`: "<file> (<why>)")."""

    images: list[SampleImage]
    left_out: list[str]

    def refusal(self) -> str | None:
        """The left-out files as one line for the run's events, or None when none was."""
        if not self.left_out:
            return None
        named = "; ".join(self.left_out[:NAMED_MAX])
        more = f"; and {len(self.left_out) - NAMED_MAX} more" if len(self.left_out) > NAMED_MAX else ""
        return f"left out {len(self.left_out)} sample image(s): {named}{more}"


def max_side(run: Run) -> int:
    """The longest side this run's trainer draws its samples at (a spec that no longer validates: a built-in
    arm's largest)."""
    spec = stored_spec(run.spec)
    if spec is None:
        return SAMPLE_MAX_SIDE
    if spec.command is not None:
        return OWN_MAX_SIDE
    return min(SAMPLE_MAX_SIDE, spec.resolution())


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) from the PNG's header chunk (IHDR); no pixel is decoded."""
    from PIL import Image

    with Image.open(io.BytesIO(png), formats=["PNG"]) as image:
        return image.size


def checkpoint_images(run: Run, step: int, extra: dict[str, Any] | None, options: dict[str, Any]) -> CheckpointImages:
    """The sample PNGs checkpoint `step`'s manifest (`extra`) lists, each name once, in its order, within
    MAX_IMAGES, MAX_BYTES and this arm's side; the rest named in `left_out`."""
    from orchestrator.results.samples import sample_names, sample_png

    side = max_side(run)
    out = CheckpointImages([], [])
    seen: set[str] = set()
    total = pixels = 0
    for sample in sample_names(extra):
        name = sample.file
        if name in seen:
            continue  # listed twice: sent once, with its first caption
        seen.add(name)
        where = f"{sample_dir(step)}/{name}"
        if len(out.images) == MAX_IMAGES:
            out.left_out.append(f"{where} (over {MAX_IMAGES} images a checkpoint)")
            continue
        try:
            png = sample_png(run, step, name, options)
            if png is None:
                continue  # listed but not written (a node's manifest may name anything): nothing to send
            width, height = png_size(png)
        except Exception as exc:  # noqa: BLE001 - refused (a link, too large, no PNG) or storage unreachable
            why = str(exc) if isinstance(exc, StoredFileRefused) else f"{type(exc).__name__}: {exc}"
            out.left_out.append(f"{where} ({why})")
            continue
        if max(width, height) > side:
            out.left_out.append(f"{where} ({width}x{height} pixels, over this arm's {side})")
        elif total + len(png) > MAX_BYTES:
            out.left_out.append(f"{where} (over {MAX_BYTES >> 20} MiB of images a checkpoint)")
        elif pixels + width * height > MAX_PIXELS:
            out.left_out.append(f"{where} (over {MAX_PIXELS / 1e6:.0f} million pixels of images a checkpoint)")
        else:
            total += len(png)
            pixels += width * height
            out.images.append(SampleImage(name, sample.caption, png))
    return out
