"""Checkpoint files of one run: atomic writes, the latest, pruning, best.pt, and provenance.

In out_dir (names: worker/run_files.py): the last KEEP_PERIODIC periodic checkpoints, `best.pt` (the
best checkpoint so far by the metric the detector judges, worker/train_record.py: a hard link to, or copy
of, a periodic file, so pruning never loses it) and `metrics.jsonl` (one record per checkpoint).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from worker.run_files import BEST_NAME, CKPT_GLOB, CKPT_RE, KEEP_PERIODIC, METRICS_NAME, ckpt_name

_REPO = Path(__file__).resolve().parents[1]


def checkpoint_path(out_dir: Path, step: int) -> Path:
    return out_dir / ckpt_name(step)


def periodic_checkpoints(out_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of the periodic checkpoints in out_dir, oldest first."""
    found = []
    for p in out_dir.glob(CKPT_GLOB):
        m = CKPT_RE.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(out_dir: Path) -> Path | None:
    found = periodic_checkpoints(out_dir)
    return found[-1][1] if found else None


def save_atomic(state: dict[str, Any], path: Path) -> None:
    """torch.save to a temp file in the same directory, fsync, then rename: a kill never leaves half a file."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def mark_best(path: Path, out_dir: Path) -> Path:
    """Make out_dir/best.pt the same content as `path` (hard link when possible, else a copy)."""
    best = out_dir / BEST_NAME
    tmp = out_dir / (BEST_NAME + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(path, tmp)
    except OSError:  # filesystems without hard links
        shutil.copy2(path, tmp)
    os.replace(tmp, best)
    return best


def prune(out_dir: Path, keep: int = KEEP_PERIODIC) -> None:
    """Delete all but the newest `keep` periodic checkpoints (best.pt is its own link, so it survives)."""
    for _, p in periodic_checkpoints(out_dir)[:-keep]:
        p.unlink(missing_ok=True)


def load(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """A checkpoint of ours. weights_only=True: torch's restricted unpickler, which builds only tensors
    and plain containers and numbers (all a checkpoint holds: state dicts, RNG state tensors, the spec
    as JSON), so a file planted in the run directory or checkpoint storage cannot run code on load."""
    return torch.load(path, map_location=map_location, weights_only=True)


def truncate_metrics(out_dir: Path, up_to_step: int) -> None:
    """Drop metrics.jsonl lines past `up_to_step` (written after the checkpoint a resume starts from)."""
    path = out_dir / METRICS_NAME
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if int(json.loads(line)["step"]) <= up_to_step:
                keep.append(line)
        except (json.JSONDecodeError, KeyError, ValueError):  # a line cut short by a kill
            continue
    path.write_text("".join(line + "\n" for line in keep))


def append_metrics(out_dir: Path, record: dict[str, Any]) -> None:
    with (out_dir / METRICS_NAME).open("a") as fh:
        fh.write(json.dumps(record, default=str) + "\n")


def provenance() -> dict[str, Any]:
    """Library versions and the code version (git commit + dirty flag) that produced a checkpoint."""
    # str(): torch.__version__ is a TorchVersion, which weights_only loading (see `load`) would refuse.
    versions = {"python": platform.python_version(), "torch": str(torch.__version__)}
    for pkg in ("torchao", "lpips", "torchvision", "numpy", "ablate-dit"):  # ablate-dit: this project
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    git: dict[str, Any] = {"commit": None, "dirty": None}
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=_REPO, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=_REPO, capture_output=True, text=True, timeout=5, check=True,
        ).stdout
        git = {"commit": commit, "dirty": bool(status.strip())}
    except (OSError, subprocess.SubprocessError):
        pass  # not a git checkout (installed wheel): recorded as None
    return {"versions": versions, "git": git}
