"""A run's sample images (worker/samples.py writes them at every evaluation): which ones exist, by step,
and their PNG bytes.

The list comes from the manifests the records carry (Metric.extra["samples"]), so listing touches no
disk; the bytes come from the run's out_dir when this machine has it (a single-host run), else from
its checkpoint storage prefix (a node that is gone). Only names matching SAMPLE_FILE_RE of a step
the run recorded can be read: nothing else under the run's folders is reachable through here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Metric, Run
from worker.run_files import SAMPLE_FILE_RE, sample_dir

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


def png_url(run_id: int, step: int, name: str) -> str:
    return f"/api/runs/{run_id}/samples/{step}/{name}"


def _manifest(extra: dict[str, Any] | None) -> dict[str, Any] | None:
    manifest = (extra or {}).get("samples")
    return manifest if isinstance(manifest, dict) and isinstance(manifest.get("files"), list) else None


def _files(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The manifest's entries that name a sample file (nothing else is ever served)."""
    return [f for f in manifest["files"] if isinstance(f, dict) and SAMPLE_FILE_RE.match(str(f.get("file", "")))]


def sample_names(extra: dict[str, Any] | None) -> list[SampleName]:
    """The sample images one checkpoint's manifest lists (Metric.extra), in its order."""
    manifest = _manifest(extra)
    return [
        SampleName(file=str(f["file"]), kind=str(f.get("kind", "")), index=int(f.get("index", 0)),
                   caption=str(f.get("caption", "")))
        for f in (_files(manifest) if manifest is not None else [])
    ]  # fmt: skip


def sample_index(records: list[tuple[int, dict[str, Any] | None]]) -> SampleIndex:
    """The SampleIndex of a run from its (step, Metric.extra) records, in step order."""
    steps, newest = [], None
    for step, extra in records:
        manifest = _manifest(extra)
        if manifest is not None:
            steps.append(step)
            newest = manifest
    return SampleIndex(steps=steps, files=sample_names({"samples": newest} if newest is not None else None))


def run_samples(session: Session, run: Run) -> list[StepSamples]:
    """Every checkpoint of `run` that recorded sample images, in step order."""
    rows = session.execute(select(Metric.step, Metric.extra).where(Metric.run_id == run.id).order_by(Metric.step)).all()
    last = rows[-1][0] if rows else None
    out = []
    for step, extra in rows:
        manifest = _manifest(extra)
        if manifest is None:
            continue
        files = [
            SampleFile(
                file=str(f["file"]),
                kind=str(f.get("kind", "")),
                index=int(f.get("index", 0)),
                caption=str(f.get("caption", "")),
                bytes=int(f.get("bytes", 0)),
                url=png_url(run.id, step, str(f["file"])),
            )
            for f in _files(manifest)
        ]
        out.append(
            StepSamples(
                run_id=run.id,
                arm=run.arm,
                step=step,
                max_side=manifest.get("max_side"),
                is_best=step == run.best_step,
                final=step == last,
                files=files,
            )
        )
    return out


def sample_png(run: Run, step: int, name: str, options: dict[str, Any]) -> bytes | None:
    """The PNG `name` of checkpoint `step`: from the run's checkpoint_dir when this machine has it, else
    from its checkpoint storage (options: fsspec storage options); None when neither holds it."""
    if not SAMPLE_FILE_RE.match(name) or step < 0:
        return None
    rel = Path(sample_dir(step)) / name
    if run.checkpoint_dir and (Path(run.checkpoint_dir) / rel).is_file():
        return (Path(run.checkpoint_dir) / rel).read_bytes()
    if run.checkpoint_url:
        from worker.checkpoint_store import open_fs  # fsspec and paramiko: only when storage is asked

        try:
            fs, root = open_fs(run.checkpoint_url, options)
            return fs.cat_file(f"{root}/{rel.as_posix()}")
        except FileNotFoundError:
            return None
    return None
