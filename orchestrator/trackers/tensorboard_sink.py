"""TensorBoard: one folder per grid, one run (subfolder) per arm, written with torch's SummaryWriter.

`tensorboard --logdir <ABLATE_TENSORBOARD_DIR>` shows the arms side by side. A resumed run writes a new
event file into the same folder, which TensorBoard reads as one run; the forwarder's cursor keeps it from
writing a step twice. The grid's effects (each comparison's interval, decision, the look's reason for it and
what the interval covers) are the text `effects` of the grid's own folder, a Markdown table at the look it
was taken after (0: a grid that does not decide), so the Text tab shows each look's table in turn.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

from orchestrator.trackers.base import GridEffects, GroupEnd, Opened, Point, Status, TrackedRun
from orchestrator.vocabulary import TrackerName

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def grid_folder(grid_id: int, grid_name: str) -> str:
    """`grid-<id>-<name>`: the grid's name made path-safe."""
    name = _UNSAFE.sub("-", grid_name).strip("-.")[:80] or "grid"
    return f"grid-{grid_id}-{name}"


def run_folder(run: TrackedRun) -> str:
    """`grid-<id>-<name>/<arm>`: arm labels are path-safe already."""
    return f"{grid_folder(run.grid_id, run.grid_name)}/{run.arm}"


def literal(text: str) -> str:
    """`text` as a Markdown code block, shown as typed: a node's label, an event's message or a caption may
    hold HTML, a remote image or a link, which TensorBoard's Text tab would otherwise render. The fence is
    longer than any run of backticks in the text, so none closes it early."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}"


def effects_markdown(table: GridEffects) -> str:
    """The effects as a Markdown table (TensorBoard's Text tab renders it)."""

    def cell(x: object) -> str:
        if x is None or x == "":
            return "-"
        # a reason may run over lines: one table row keeps it whole
        return f"{x:+.4g}" if isinstance(x, float) else " ".join(str(x).replace("|", "/").split())

    lines = [f"effects, {table.at}", "", "| " + " | ".join(table.columns) + " |",
             "|" + "---|" * len(table.columns)]  # fmt: skip
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in table.rows]
    return "\n".join(lines)


def png_array(png: bytes) -> Any:  # noqa: ANN401 - a numpy array (HWC, uint8)
    """The pixels TensorBoard's add_image needs; the forwarder checked the header's size against the arm's
    sample side before (trackers/sample_images.py), so what is decoded here is bounded."""
    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        return np.asarray(image.convert("RGB"))


class TensorBoardSink:
    name = TrackerName.tensorboard

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.writers: dict[int, Any] = {}  # run id -> SummaryWriter

    def open(self, run: TrackedRun) -> Opened:
        from torch.utils.tensorboard import SummaryWriter

        folder = run.external_id or run_folder(run)
        writer = SummaryWriter(log_dir=str(self.root / folder))
        if run.external_id is None:  # the spec once, when the run is new
            writer.add_text("spec", "```\n" + json.dumps(run.spec, indent=2, sort_keys=True) + "\n```", 0)
        self.writers[run.run_id] = writer
        return Opened(folder)

    def checkpoint(self, run_id: int, point: Point) -> None:
        writer = self.writers[run_id]
        for key, value in point.scalars.items():
            writer.add_scalar(key, value, point.step)
        for image in point.images:
            tag = "samples/" + image.name.removesuffix(".png")
            writer.add_image(tag, png_array(image.png), point.step, dataformats="HWC")
        if point.images:
            writer.add_text("samples/captions", literal("\n\n".join(f"{i.name}: {i.caption}" for i in point.images)),
                            point.step)  # fmt: skip
        writer.add_text("judged_metric", point.judged_metric, point.step)
        for key, label in point.labels.items():  # beside the metric: which network's features it measured
            writer.add_text(key, literal(label), point.step)
        writer.flush()

    def status(self, run_id: int, status: Status) -> None:
        writer = self.writers[run_id]
        for note in status.notes:
            writer.add_text(f"events/{note.kind}", literal(note.message), note.step)
        if status.decision is not None:
            writer.add_text("decision", literal(f"{status.decision} at step {status.decision_step}: "
                                                f"{status.decision_reason}"),
                            status.decision_step or 0)
        writer.flush()
        if status.ended:
            self.close(run_id)

    def close(self, run_id: int) -> None:
        writer = self.writers.pop(run_id, None)
        if writer is not None:
            writer.close()

    def finish_group(self, group: GroupEnd) -> None:
        pass  # the grid is a folder of run folders: nothing to finish

    def effects(self, table: GridEffects) -> str | None:
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(log_dir=str(self.root / grid_folder(table.grid_id, table.grid_name))) as writer:
            writer.add_text("effects", effects_markdown(table), table.step)
        return None
