"""A command arm's process: the researcher's own trainer, run the way ArmWorker runs train_arm.

`CommandArm.records()` is a generator with train_arm's record contract (one dict per metrics line, with
`step`, the script's metrics, and for a line that names a checkpoint the same checkpoint fields the
built-in trainer writes), so the actor, the checkpoint store, ingest and the detector treat it alike.
The contract the script sees (docs/your-trainer.md):

    cwd                   a fresh copy of `code`, or of the archive of it the controller shipped to this
                          node (out_dir/work), so an edit mid-grid changes no running attempt
    CUDA_VISIBLE_DEVICES  the GPUs Ray gave the actor (inherited): command.gpus of them
    ABLATE_RUN_DIR        out_dir/run: checkpoints/ lives there (stored whole, worker/folder_mirror.py) and
                          is restored before the start; PNGs in samples/step_N/ become the step's samples
    ABLATE_METRICS_FILE   JSON lines {"step": int, "<metric>": float, ..., "checkpoint": "checkpoints/x.pt"}
    ABLATE_STOP_FILE      created on a stop; then stop_grace_s, SIGTERM, term_grace_s, SIGKILL
    ABLATE_RESUMED        "1" when checkpoints/ held a checkpoint at the start, else "0"

A named checkpoint is hard-linked into ablate's own layout (out_dir/ckpt_{step:07d}.pt, best.pt), so the
checkpoint store uploads and prunes it as it does the built-in trainer's. Imports no torch.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import tarfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Any

from model.spec import ArmSpec, CommandEnd
from worker.failure import Described
from worker.node_ray import end_with_parent
from worker.run_files import (
    BEST_NAME,
    CKPT_GLOB,
    CKPT_RE,
    COMMAND_CHECKPOINTS_DIR,
    COMMAND_METRICS_NAME,
    COMMAND_RUN_DIR,
    SAMPLES_DIR,
    ckpt_name,
    sample_dir,
)

WORK_DIR = "work"  # the copy of `code`, the process's working directory
STOP_FILE = "STOP"
STDERR_LOG, STDOUT_LOG = "stderr.log", "stdout.log"
STDERR_TAIL = 50  # lines of stderr a failed run shows
MAX_LINE_BYTES = 1 << 20  # a metrics line is a few hundred bytes; a megabyte is a script gone wrong
POLL_S = 0.2  # how often the metrics file is read and the stop flag checked
MAX_SAMPLES = 64  # PNGs shown per step: a gallery, not an archive
KEEP_PERIODIC = 2  # ckpt_*.pt links kept in out_dir (the script keeps its own files as it likes)
# Keys ablate sets on a record; a script's line must not forge them.
OURS = ("run_id", "checkpoint_file", "is_best", "best_step", "best_checkpoint")
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


class CommandFailed(Described):
    """The command failed: the message (exit code and stderr tail, or a broken contract) is the run's error."""


def checkpoint_target(run_dir: Path, name: Any) -> Path | None:
    """The file under run_dir/checkpoints/ that a checkpoint name (relative to ABLATE_RUN_DIR) means, or None
    for a name that is not one: absolute, with `..`, outside checkpoints/, or resolving outside it through a
    link. The script's metrics line and a stored record (which another node may have written) both pass here."""
    rel = PurePosixPath(name) if isinstance(name, str) else None
    inside = rel is not None and rel.parts[:1] == (COMMAND_CHECKPOINTS_DIR,) and len(rel.parts) >= 2
    if rel is None or rel.is_absolute() or ".." in rel.parts or not inside:
        return None
    target = run_dir / rel
    root = (run_dir / COMMAND_CHECKPOINTS_DIR).resolve()
    return target if target.resolve().is_relative_to(root) and target.resolve() != root else None


def _link(src: Path, dst: Path) -> None:
    """dst becomes the same file as src: a hard link where possible (no copy of a large checkpoint)."""
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return float(value)
    except ValueError:
        return None


class CommandArm:
    """One attempt of a command arm in `out_dir`. `prior`: the run's records from earlier attempts."""

    def __init__(self, spec: ArmSpec, out_dir: Path, should_stop: Callable[[], bool],
                 prior: list[dict[str, Any]], archive: Path | None = None) -> None:  # fmt: skip
        if spec.command is None:
            raise ValueError("not a command arm")
        self.command = spec.command
        self.out_dir = Path(out_dir)
        self.run_dir = self.out_dir / COMMAND_RUN_DIR
        self.should_stop = should_stop
        self.archive = archive  # the code as shipped to this node (a tar named by its SHA-256), else None
        self.metric, self.mode = spec.detector.metric, spec.detector.metric_mode
        self.prior = {int(r["step"]): r for r in prior}
        self.last_step = max(self.prior, default=-1)
        self.best: tuple[int, float] | None = None
        for step, rec in sorted(self.prior.items()):
            if rec.get("is_best"):
                value = _number(rec.get(self.metric))
                self.best = (step, value) if value is not None else self.best
        self.ended_by: CommandEnd | None = None
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL)
        self._offset = 0
        self._t0 = time.monotonic()
        self._wall_before = float(_number(self.prior[self.last_step].get("wall_time_s")) or 0) if self.prior else 0.0

    # -- before the start ------------------------------------------------------------------------

    def restore(self) -> bool:
        """Put the newest stored checkpoint (and the best) back under the name the script gave it, when a
        new node fetched them from storage as ckpt_*.pt / best.pt; True when checkpoints/ holds any file."""
        ckpts = self.run_dir / COMMAND_CHECKPOINTS_DIR
        ckpts.mkdir(parents=True, exist_ok=True)
        local = sorted((int(m.group(1)), p) for p in self.out_dir.glob(CKPT_GLOB) if (m := CKPT_RE.match(p.name)))
        wanted = [(step, path) for step, path in local[-1:]]
        if self.best is not None and (self.out_dir / BEST_NAME).exists():
            wanted.append((self.best[0], self.out_dir / BEST_NAME))
        for step, path in wanted:
            name = (self.prior.get(step) or {}).get("checkpoint_file")
            if name is None:
                continue
            target = checkpoint_target(self.run_dir, name)
            if target is None:  # a stored record is a node's word: never a path to write at
                raise CommandFailed(f"the stored record of step {step} names checkpoint_file {str(name)[:200]!r}, "
                                    f"not a path under {COMMAND_CHECKPOINTS_DIR}/ of ABLATE_RUN_DIR; not restored")
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                _link(path, target)
        return any(p.is_file() for p in ckpts.rglob("*"))

    def _copy_code(self, work: Path) -> None:
        """`code` (or the archive of it the controller shipped) as a fresh working directory."""
        shutil.rmtree(work, ignore_errors=True)  # each attempt starts from the code as it is, not as left
        if self.archive is not None:
            data = self.archive.read_bytes()
            if hashlib.sha256(data).hexdigest() != self.archive.name.removesuffix(".tar"):
                raise CommandFailed(f"the code archive {self.archive} on node {socket.gethostname()} does not "
                                    "match its SHA-256 name (changed on the node)")
            work.mkdir(parents=True)
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                tar.extractall(work, filter="tar")  # the controller's own tar: links kept, nothing outside work
            return
        code = Path(self.command.code)
        if not code.is_dir():
            raise CommandFailed(f"command.code {self.command.code!r} is not a directory on node "
                                f"{socket.gethostname()}: the code must be there before the arm starts")
        shutil.copytree(code, work, symlinks=True, ignore=shutil.ignore_patterns(".git", "__pycache__"))

    def _prepare(self) -> tuple[Path, dict[str, str]]:
        work = self.out_dir / WORK_DIR
        self._copy_code(work)
        resumed = self.restore()
        (self.run_dir / STOP_FILE).unlink(missing_ok=True)
        env = {
            **os.environ,
            **self.command.env,
            "ABLATE_RUN_DIR": str(self.run_dir),
            "ABLATE_METRICS_FILE": str(self.run_dir / COMMAND_METRICS_NAME),
            "ABLATE_STOP_FILE": str(self.run_dir / STOP_FILE),
            "ABLATE_RESUMED": "1" if resumed else "0",
            "PYTHONUNBUFFERED": "1",  # its stderr tail is current when it dies
        }
        return work, env

    # -- the run ---------------------------------------------------------------------------------

    def records(self) -> Iterator[dict[str, Any]]:
        """Start the command and yield a record per new metrics line until it exits. Raises CommandFailed
        when it exits non-zero without a stop, or breaks the metrics contract."""
        work, env = self._prepare()
        with (self.out_dir / STDOUT_LOG).open("ab") as out:
            proc = subprocess.Popen(
                self.command.argv, cwd=work, env=env, stdout=out, stderr=subprocess.PIPE,
                start_new_session=True, preexec_fn=end_with_parent(signal.SIGKILL),  # a killed worker leaves no trainer
            )  # fmt: skip
        reader = threading.Thread(target=self._read_stderr, args=(proc.stderr,), daemon=True)
        reader.start()
        stop_at = term_at = kill_at = None
        try:
            while True:
                exited = self._wait(proc, POLL_S)
                yield from self._new_records()
                if exited:
                    break
                now = time.monotonic()
                if stop_at is None and self.should_stop():
                    (self.run_dir / STOP_FILE).touch()
                    stop_at = now
                if stop_at is not None and term_at is None and now - stop_at >= self.command.stop_grace_s:
                    self._signal(proc, signal.SIGTERM)
                    term_at = now
                if term_at is not None and kill_at is None and now - term_at >= self.command.term_grace_s:
                    self._signal(proc, signal.SIGKILL)
                    kill_at = now
        finally:
            if proc.poll() is None:  # the actor is ending (an error, a kill): no trainer outlives it
                self._signal(proc, signal.SIGKILL)
                proc.wait()
            reader.join(timeout=10)
        self.ended_by = "sigkill" if kill_at else "sigterm" if term_at else "stop_file" if stop_at else "exit"
        if stop_at is None and proc.returncode != 0:
            tail = "\n".join(self.stderr_tail)
            raise CommandFailed(f"command exited with code {proc.returncode}; the last {len(self.stderr_tail)} "
                                f"lines of its stderr:\n{tail}" if tail else
                                f"command exited with code {proc.returncode} (nothing on stderr)")

    @staticmethod
    def _wait(proc: subprocess.Popen[bytes], timeout: float) -> bool:
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    @staticmethod
    def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        """The whole process group: a trainer's data-loader workers end with it."""
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    def _read_stderr(self, pipe: IO[bytes]) -> None:
        with pipe, (self.out_dir / STDERR_LOG).open("ab") as log:
            for raw in pipe:
                log.write(raw)
                log.flush()
                self.stderr_tail.append(ANSI_ESCAPE.sub("", raw.decode(errors="replace")).rstrip())

    # -- metrics lines ---------------------------------------------------------------------------

    def _new_records(self) -> Iterator[dict[str, Any]]:
        path = self.run_dir / COMMAND_METRICS_NAME
        if not path.exists():
            return
        with path.open("rb") as fh:
            fh.seek(self._offset)
            data = fh.read()
        while (end := data.find(b"\n")) >= 0:  # only complete lines: the script may be mid-write
            line, data = data[:end], data[end + 1 :]
            self._offset += end + 1
            if line.strip():
                record = self._record(line)
                if record is not None:
                    yield record
        if len(data) > MAX_LINE_BYTES:
            raise CommandFailed(f"ABLATE_METRICS_FILE: a line over {MAX_LINE_BYTES} bytes without a newline")

    def _record(self, line: bytes) -> dict[str, Any] | None:
        """The record of one metrics line; None for a step already recorded (a resumed script repeats the
        steps after its checkpoint)."""
        try:
            line_data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CommandFailed(f"ABLATE_METRICS_FILE: a line is not JSON ({exc}): {line[:200]!r}") from None
        step = line_data.get("step") if isinstance(line_data, dict) else None
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise CommandFailed(f"ABLATE_METRICS_FILE: each line is a JSON object with an integer \"step\" >= 0; "
                                f"got {line[:200]!r}")
        if step <= self.last_step:
            return None
        record = {k: v for k, v in line_data.items() if k not in OURS}
        record.setdefault("wall_time_s", self._wall_before + time.monotonic() - self._t0)
        name = record.pop("checkpoint", None)
        record.pop("samples", None)  # ablate's manifest of the PNGs below, never the script's
        if name is not None:
            record.update(self._keep_checkpoint(step, name, record))
        samples = self._keep_samples(step)
        if samples is not None:
            record["samples"] = samples
        self.last_step = step
        return record

    def _keep_samples(self, step: int) -> dict[str, Any] | None:
        """PNGs the script wrote to samples/step_<step>/ before the line of that step, linked into ablate's
        sample layout (own_<i>.png, stored and shown as the built-in arm's are); their manifest."""
        folders = [p for p in (self.run_dir / SAMPLES_DIR).glob("step_*")
                   if p.name.removeprefix("step_").isdigit() and int(p.name.removeprefix("step_")) == step]
        pngs = sorted(p for f in folders for p in f.glob("*.png") if p.is_file() and not p.is_symlink())
        if not pngs:
            return None
        dest = self.out_dir / sample_dir(step)
        dest.mkdir(parents=True, exist_ok=True)
        files = []
        for i, png in enumerate(pngs[:MAX_SAMPLES]):
            _link(png, dest / f"own_{i}.png")
            files.append({"file": f"own_{i}.png", "kind": "own", "index": i, "caption": png.name,
                          "bytes": png.stat().st_size})  # fmt: skip
        return {"dir": sample_dir(step), "files": files, "max_side": None}

    def _keep_checkpoint(self, step: int, name: Any, record: dict[str, Any]) -> dict[str, Any]:
        """Link the named file into ablate's layout (ckpt_*.pt, best.pt by the detector's metric) and
        return the record's checkpoint fields."""
        src = checkpoint_target(self.run_dir, name)
        if src is None:
            raise CommandFailed(f"ABLATE_METRICS_FILE step {step}: \"checkpoint\" must be a path under "
                                f"{COMMAND_CHECKPOINTS_DIR}/ relative to ABLATE_RUN_DIR, got {name!r}")
        rel = src.relative_to(self.run_dir).as_posix()
        if src.is_symlink() or not src.is_file():
            raise CommandFailed(f"ABLATE_METRICS_FILE step {step}: checkpoint {name!r} is not a file in "
                                "ABLATE_RUN_DIR; write the checkpoint before the line that names it")
        ckpt = self.out_dir / ckpt_name(step)
        _link(src, ckpt)
        for old in sorted(p for p in self.out_dir.glob(CKPT_GLOB) if CKPT_RE.match(p.name))[:-KEEP_PERIODIC]:
            old.unlink(missing_ok=True)  # best.pt is its own link: pruning never loses it
        value = _number(record.get(self.metric))
        is_best = value is not None and math.isfinite(value) and (
            self.best is None or (value < self.best[1] if self.mode == "min" else value > self.best[1])
        )
        if is_best:
            _link(ckpt, self.out_dir / BEST_NAME)
            self.best = (step, value)  # type: ignore[assignment]
        return {
            "checkpoint": str(ckpt),
            "checkpoint_file": rel,
            "is_best": is_best,
            "best_step": self.best[0] if self.best else None,
            "best_checkpoint": str(self.out_dir / BEST_NAME) if self.best else None,
        }
