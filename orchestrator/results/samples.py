"""A run's sample images (worker/samples.py writes them at every evaluation): which ones exist, by step,
and their PNG bytes.

The list comes from the manifests the records carry (Metric.extra["samples"]), so listing touches no
disk; the bytes come from the run's out_dir when this machine has it (a single-host run), else from
its checkpoint storage prefix (a node that is gone). Only names matching SAMPLE_FILE_RE of a step
the run recorded can be read: nothing else under the run's folders is reachable through here.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Metric, Run
from worker.run_files import SAMPLE_FILE_RE, sample_dir
from worker.stored_file import StoredFileRefused, read_stored

# The most bytes of one sample PNG the controller reads (the node sets a sample's size): the built-in
# trainer's are tens of KB, a command arm's own PNG a few MB.
MAX_SAMPLE_BYTES = 16 << 20
# The longest side of a sample PNG served or embedded, by its header: the largest a trainer draws (a
# built-in arm's 128, a command arm's own pictures as the trackers take them). A PNG of 16 MiB can claim
# 100,000 x 100,000 pixels of zeros; whoever opens the gallery or the report would decode them.
MAX_SAMPLE_SIDE = 2048

# What each kind of image is, for captions in the gallery and the report.
KIND_LABELS = {
    "target": "target (held-out image)",
    "recon": "reconstruction (caption + identity tokens)",
    "text": "text only (caption)",
    "caption": "manipulation: caption",
    "edit": "manipulation: edited caption",
    "own": "the trainer's own image (its file name)",
}


class SampleName(BaseModel):
    file: str
    kind: str  # a key of KIND_LABELS
    index: int
    caption: str


class SampleFile(SampleName):
    bytes: int
    url: str  # the API path of the PNG


class StepSamples(BaseModel):
    """The sample images of one checkpoint of one run."""

    run_id: int
    arm: str
    step: int
    max_side: int | None
    is_best: bool  # the run's best (detector-kept) checkpoint
    final: bool  # its last checkpoint
    files: list[SampleFile]


class SampleIndex(BaseModel):
    """A run's sample images in short, for the dashboard's gallery (in every poll of a live grid, so
    it stays a few hundred bytes per checkpoint): the steps that have images, and the fixed set of
    images each step holds (the same prompts and seeds at every evaluation, worker/samples.py), as the
    newest step lists it. The PNG of one is png_url(run_id, step, file)."""

    steps: list[int]
    files: list[SampleName]
    malformed: list[int] = []  # steps whose manifest a node recorded malformed: left out


def png_url(run_id: int, step: int, name: str) -> str:
    return f"/api/runs/{run_id}/samples/{step}/{name}"


class ManifestFile(BaseModel):
    """One entry of a checkpoint's samples manifest as a node recorded it (worker/samples.py writes it)."""

    file: str
    kind: str = ""
    index: int = 0
    caption: str = ""
    bytes: int = 0


class Manifest(BaseModel):
    """A record's `samples`: a node's word, so each record's is checked on every read; one that does not
    parse (an `index` of "x") is left out with its step named, never a failure of the whole grid."""

    files: list[ManifestFile]
    max_side: int | None = None


def _manifest(extra: dict[str, Any] | None) -> Manifest | None:
    """The record's manifest with only sample-file names kept (nothing else is ever served); None when the
    record has none. Raises ValidationError for one that is malformed."""
    raw = (extra or {}).get("samples")
    if raw is None:
        return None
    manifest = Manifest.model_validate(raw)
    manifest.files = [f for f in manifest.files if SAMPLE_FILE_RE.match(f.file)]
    return manifest


def _manifests(records: list[tuple[int, dict[str, Any] | None]]) -> tuple[list[tuple[int, Manifest]], list[int]]:
    """(step, manifest) of the records with a well-formed one, and the steps whose manifest was malformed."""
    good, malformed = [], []
    for step, extra in records:
        try:
            manifest = _manifest(extra)
        except ValidationError:
            malformed.append(step)
            continue
        if manifest is not None:
            good.append((step, manifest))
    return good, malformed


def _names(manifest: Manifest | None) -> list[SampleName]:
    return [SampleName(file=f.file, kind=f.kind, index=f.index, caption=f.caption)
            for f in (manifest.files if manifest is not None else [])]  # fmt: skip


def sample_names(extra: dict[str, Any] | None) -> list[SampleName]:
    """The sample images one checkpoint's manifest lists (Metric.extra), in its order; none where it is
    malformed."""
    try:
        return _names(_manifest(extra))
    except ValidationError:
        return []


def sample_index(records: list[tuple[int, dict[str, Any] | None]]) -> SampleIndex:
    """The SampleIndex of a run from its (step, Metric.extra) records, in step order."""
    good, malformed = _manifests(records)
    newest = good[-1][1] if good else None
    return SampleIndex(steps=[step for step, _ in good], files=_names(newest), malformed=malformed)


def run_samples(session: Session, run: Run) -> list[StepSamples]:
    """Every checkpoint of `run` that recorded a well-formed samples manifest, in step order."""
    rows = session.execute(select(Metric.step, Metric.extra).where(Metric.run_id == run.id).order_by(Metric.step)).all()
    last = rows[-1][0] if rows else None
    good, _ = _manifests([(step, extra) for step, extra in rows])
    return [
        StepSamples(
            run_id=run.id,
            arm=run.arm,
            step=step,
            max_side=manifest.max_side,
            is_best=step == run.best_step,
            final=step == last,
            files=[SampleFile(file=f.file, kind=f.kind, index=f.index, caption=f.caption, bytes=f.bytes,
                              url=png_url(run.id, step, f.file)) for f in manifest.files],  # fmt: skip
        )
        for step, manifest in good
    ]


def sample_png(run: Run, step: int, name: str, options: dict[str, Any]) -> bytes | None:
    """The PNG `name` of checkpoint `step`: from the run's checkpoint_dir when this machine has it, else
    from its checkpoint storage (options: fsspec storage options); None when neither holds it. Raises
    StoredFileRefused for a file that is a link, lies outside the run's folder, is over MAX_SAMPLE_BYTES or
    is not a PNG: a node wrote it, and the controller serves nothing else."""
    if not SAMPLE_FILE_RE.match(name) or step < 0:
        return None
    rel = Path(sample_dir(step)) / name
    import fsspec  # fsspec and paramiko: only when a file is asked for

    data = None
    if run.checkpoint_dir and os.path.lexists(Path(run.checkpoint_dir) / rel):
        data = read_stored(fsspec.filesystem("file"), run.checkpoint_dir, str(Path(run.checkpoint_dir) / rel),
                           MAX_SAMPLE_BYTES)  # fmt: skip
    elif run.checkpoint_url:
        from worker.checkpoint_store import open_fs

        try:
            fs, root = open_fs(run.checkpoint_url, options)
            data = read_stored(fs, root, f"{root}/{rel.as_posix()}", MAX_SAMPLE_BYTES)
        except FileNotFoundError:
            return None
    if data is not None:
        check_png(data, f"{sample_dir(step)}/{name} of run {run.id}")
    return data


def check_png(data: bytes, what: str) -> None:
    """Refuse bytes that are not one well-formed PNG (a node may name anything `x.png`), or whose header
    claims a side over MAX_SAMPLE_SIDE. No pixel is decoded here."""
    from PIL import Image  # Pillow: only when an image is read

    try:
        with Image.open(io.BytesIO(data), formats=["PNG"]) as image:
            side, size = max(image.size), "{}x{} pixels".format(*image.size)
            image.verify()  # the chunks' CRCs, without decoding the pixels
    except Image.DecompressionBombError as exc:  # over twice Pillow's MAX_IMAGE_PIXELS: refused on open
        side, size = MAX_SAMPLE_SIDE + 1, str(exc).split(",")[0]
    except Exception as exc:  # noqa: BLE001 - Pillow raises many kinds for a broken file
        raise StoredFileRefused(f"{what} is not a PNG ({type(exc).__name__}: {exc})", "not a PNG") from None
    if side > MAX_SAMPLE_SIDE:
        raise StoredFileRefused(f"{what} is {size}, over the {MAX_SAMPLE_SIDE}-pixel side a sample may have",
                                f"over {MAX_SAMPLE_SIDE} pixels a side")
