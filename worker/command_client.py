"""The few calls a Python trainer needs to run as an ablate command arm; the standard library only.

Import it, or copy this file next to your script: a script in any language can do the same with the
files named in the environment (docs/your-trainer.md).

    from worker.command_client import checkpoint_dir, report, resumed, should_stop

    ckpts = checkpoint_dir()
    start = load(ckpts / "last.pt") if resumed() else 0
    for step in range(start, steps):
        ...
        if step % 100 == 0:
            save(ckpts / f"step_{step}.pt")
            report(step, checkpoint=f"step_{step}.pt", val_loss=loss)
        if should_stop():
            save(...); break

Outside ablate (no ABLATE_RUN_DIR) it writes under ./ablate-run, so the script runs the same by hand.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path


def run_dir() -> Path:
    """ABLATE_RUN_DIR: the run's own directory (not the working directory)."""
    return Path(os.environ.get("ABLATE_RUN_DIR", "ablate-run"))


def checkpoint_dir() -> Path:
    """<run dir>/checkpoints: stored durably and restored before a resume; created if missing."""
    path = run_dir() / "checkpoints"
    path.mkdir(parents=True, exist_ok=True)
    return path


def resumed() -> bool:
    """True when the run restarted (another node, a lost worker) and checkpoint_dir() holds its checkpoints."""
    return os.environ.get("ABLATE_RESUMED") == "1"


def should_stop() -> bool:
    """True once ablate asked the arm to stop (the detector, a user, a sweep's budget): save and exit 0
    within the grid's stop_grace_s, or SIGTERM follows."""
    return Path(os.environ.get("ABLATE_STOP_FILE", run_dir() / "STOP")).exists()


def _number(value: float) -> float | str:
    value = float(value)
    return value if math.isfinite(value) else str(value)  # "nan", "inf": still strict JSON


def report(step: int, checkpoint: str | Path | None = None, **metrics: float | Sequence[float]) -> None:
    """Append one metrics line. `checkpoint`: a file you just wrote under checkpoint_dir() (its name, or a
    path), kept durably; the detector's best is kept as best.pt. Flushed and fsynced: a crash loses none.
    A metric `m` may come with `m_samples`, its value on each held-out item (the same items, in the same
    order, for every arm and seed of the grid): the report then compares arms on it with paired, across-seed
    and seeds x items intervals, as on ablate's own metrics."""
    line: dict[str, object] = {"step": int(step)}
    for name, value in metrics.items():
        line[name] = [_number(v) for v in value] if isinstance(value, Sequence) else _number(value)
    if checkpoint is not None:
        path = Path(checkpoint)
        if path.is_absolute():
            path = path.relative_to(run_dir().resolve()) if path.is_relative_to(run_dir().resolve()) else path
        line["checkpoint"] = str(path if path.parts[:1] == ("checkpoints",) else Path("checkpoints") / path)
    target = Path(os.environ.get("ABLATE_METRICS_FILE", run_dir() / "metrics.jsonl"))
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("a") as fh:
        fh.write(json.dumps(line) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
