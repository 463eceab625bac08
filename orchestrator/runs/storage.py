"""The controller's side of durable checkpoint storage (workers upload: worker/checkpoint_store.py).

- Where: each run has its own prefix under settings.checkpoint_root, named by its id and creation time
  (`run-17-20261122T142301`), so two databases that share a bucket never resume each other's files.
- What happened: the worker's upload log arrives with every poll; each entry becomes one event
  (checkpoint.stored | store_failed | store_abandoned | fetched | fetch_failed), exactly once across
  polls and controller restarts (entries carry a per-attempt sequence number). The log is a node's
  claim: `StorageStatus` (worker/protocol.py) admits only these kinds, with the fields each carries,
  bounded in size and count; anything else refuses the reply (fleet/agent_link.py).
- Alarm: a run whose newest ingested checkpoint has not reached storage for checkpoint_alarm_minutes
  is flagged on the dashboard, with the last error. A stored step counts only where the run has that
  checkpoint: a node cannot silence the alarm with a step that never was.
- Copy-back: a sweep downloads each run's prefix (its sample images too) instead of pulling from the node.
Imports no torch: worker.checkpoint_store needs only fsspec and paramiko, worker.run_files (the file names) nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from model.spec import STATE_BYTES_PER_PARAM, ArmSpec, estimate_params
from orchestrator.db.events import record_event
from orchestrator.db.models import Event, Metric, Run, aware
from orchestrator.settings import Settings
from worker.protocol import HELD_EVENTS, STORAGE_EVENTS, StorageStatus
from worker.run_files import COMMAND_CHECKPOINTS, COMMAND_RUN_DIR, SAMPLE_FILE_RE, SAMPLE_STEP_RE, SAMPLES_DIR

# Upload-log entries stored per run. An honest run logs a few per checkpoint (stored, a failed try, fetched
# on resume); a node's log is bounded per reply (worker/protocol.py) but not over a run, and each entry may
# hold about 12 KB: uncapped, a node raising its entry numbers every poll wrote gigabytes an hour.
MAX_STORAGE_EVENTS = 2000
LOG_CAPPED = "storage.log_capped"  # the controller's own event, never an entry of a node's log


def run_storage_url(settings: Settings, run: Run) -> str:
    """The run's prefix in checkpoint storage (fixed at its first launch, kept on the run)."""
    if run.checkpoint_url:
        return run.checkpoint_url
    created = run.created_at or datetime.now(UTC)
    return f"{settings.checkpoint_root.rstrip('/')}/run-{run.id}-{created:%Y%m%dT%H%M%S}"


def worker_storage(settings: Settings, url: str) -> dict[str, Any]:
    """worker.checkpoint_store.StoreConfig as the dict the worker actor takes."""
    return {
        "url": url,
        "options": dict(settings.checkpoint_options),
        "keep_last": settings.checkpoint_keep_last,
        "flush_timeout_s": settings.checkpoint_flush_timeout_s,
    }


def worker_compile_cache(settings: Settings) -> dict[str, Any]:
    """worker.compile_cache.CompileCache as the dict the worker actor takes: the node's cache directory
    (beside the runs', so it outlives them) and the shared store, if the operator set one."""
    return {
        "dir": str(settings.home_dir.expanduser().resolve() / "compile-cache"),
        "url": settings.compile_cache_url,
        "options": dict(settings.checkpoint_options),
    }


def worker_data_store(settings: Settings) -> dict[str, Any]:
    """worker.data_fetch.DataStore as the dict the worker actor takes: how a node reaches data.url."""
    options = settings.data_options if settings.data_options is not None else settings.checkpoint_options
    cache = settings.data_cache_dir or settings.home_dir / "data-cache"
    return {"options": dict(options), "cache_dir": str(cache.expanduser().resolve())}


def seen_seq(session: Session, run_id: int, attempt: int) -> int:
    """The newest upload-log entry of this attempt's worker already stored as an event (0: none)."""
    rows = session.scalars(
        select(Event.data).where(Event.run_id == run_id, Event.kind.in_(STORAGE_EVENTS))
    ).all()
    seqs = [int(d["seq"]) for d in rows if d and d.get("attempt") == attempt and "seq" in d]
    return max(seqs, default=0)


def record_storage(session: Session, run: Run, attempt: int, status: StorageStatus | None, seen: int) -> int:
    """One event per upload-log entry newer than `seen`, of the entry's storage kind; returns the new `seen`.

    At most MAX_STORAGE_EVENTS per run: past them only an entry that says a newer checkpoint of the run
    is held is stored (what the storage alarm needs), and one `storage.log_capped` event says so."""
    entries = [e for e in (status.log if status is not None else []) if e.seq > seen]
    if not entries:
        return seen
    stored = session.scalar(
        select(func.count()).select_from(Event).where(Event.run_id == run.id, Event.kind.in_(STORAGE_EVENTS))
    ) or 0
    capped: _Capped | None = None
    for entry in entries:
        seen = entry.seq
        if stored >= MAX_STORAGE_EVENTS:
            capped = capped or _Capped.read(session, run)
            if not capped.admits(entry):
                continue
        data = {**entry.data.model_dump(exclude_none=True), "seq": entry.seq, "attempt": attempt,
                "worker_time": entry.time}
        record_event(session, run, entry.kind, entry.message, **data)
        stored += 1
    return seen


class _Capped:
    """A run past MAX_STORAGE_EVENTS: what it may still store (a held step newer than the newest held
    one, of a checkpoint the run has), and whether its `storage.log_capped` event is recorded."""

    def __init__(self, held: int, checkpoints: set[int], noted: bool, session: Session, run: Run) -> None:
        self.held, self.checkpoints, self.noted = held, checkpoints, noted
        self.session, self.run = session, run

    @classmethod
    def read(cls, session: Session, run: Run) -> _Capped:
        rows = session.scalars(
            select(Event.data).where(Event.run_id == run.id, Event.kind.in_(HELD_EVENTS))
        ).all()
        held = max((int(d["step"]) for d in rows if d and isinstance(d.get("step"), int)), default=-1)
        checkpoints = set(session.scalars(select(Metric.step).where(Metric.run_id == run.id, Metric.step > held)))
        noted = session.scalar(
            select(Event.id).where(Event.run_id == run.id, Event.kind == LOG_CAPPED).limit(1)
        ) is not None
        return cls(held, checkpoints, noted, session, run)

    def admits(self, entry: Any) -> bool:
        step = entry.data.step
        if entry.kind in HELD_EVENTS and step is not None and step > self.held and step in self.checkpoints:
            self.held = step
            return True
        if not self.noted:
            self.noted = True
            record_event(self.session, self.run, LOG_CAPPED,
                         f"the node's upload log passed {MAX_STORAGE_EVENTS} entries for this run: later entries "
                         "are not stored, except one per newer checkpoint held in storage", limit=MAX_STORAGE_EVENTS)
        return False


def storage_alarms(
    session: Session, runs: list[Run], minutes: float, now: datetime | None = None
) -> dict[int, dict[str, Any]]:
    """Per run with a storage prefix: the newest stored step, since when its newest checkpoints are
    not stored (the ingest time of the first checkpoint past the stored one), the last error, and
    `alarm` when that has lasted `minutes` or more."""
    now = aware(now or datetime.now(UTC))
    ids = [r.id for r in runs if r.checkpoint_url]
    out: dict[int, dict[str, Any]] = {}
    if not ids:
        return out
    events: dict[int, list[Event]] = {i: [] for i in ids}
    for e in session.scalars(
        select(Event).where(Event.run_id.in_(ids), Event.kind.in_(("checkpoint", *STORAGE_EVENTS))).order_by(Event.id)
    ):
        events[e.run_id].append(e)
    for r in runs:
        if r.id not in events:
            continue
        evs = events[r.id]
        checkpoints = {(e.data or {}).get("step") for e in evs if e.kind == "checkpoint"}
        # A stored step counts only where the run has that checkpoint (a node's log is a claim).
        held = [e for e in evs if e.kind in HELD_EVENTS and (e.data or {}).get("step") in checkpoints - {None}]
        stored_step = max((int(e.data["step"]) for e in held), default=None)
        last_held = max((e.id for e in held), default=0)
        unstored = [
            e for e in evs
            if e.kind == "checkpoint" and (stored_step is None or int((e.data or {}).get("step", 0)) > stored_step)
        ]
        since = aware(unstored[0].time) if unstored else None
        failures = [e for e in evs if e.kind in ("checkpoint.store_failed", "checkpoint.store_abandoned")
                    and e.id > last_held]
        waited = (now - since).total_seconds() / 60 if since else 0.0
        out[r.id] = {
            "url": r.checkpoint_url,
            "stored_step": stored_step,
            "unstored_since": since.isoformat() if since else None,
            "minutes_unstored": round(waited, 1) if since else None,
            "failed_attempts": len(failures),
            "last_error": (failures[-1].data or {}).get("error") or failures[-1].message if failures else None,
            "alarm": since is not None and waited >= minutes,
        }
    return out


# What a copy-back may take of one run by default (ABLATE_COPY_BACK_MAX_BYTES unset): its kept checkpoints
# (keep_last periodic ones and best.pt, and one more: a new one is uploaded before the oldest is pruned),
# each the size of the arm's model in fp32 with its EMA and two optimizer moments (the training state less
# the gradients; docs/operations.md measures 3.82 GB for arm A at seed size), a tenth to spare, plus room
# for its samples, records and logs. A command arm's checkpoints are its trainer's own: a fixed allowance.
CHECKPOINT_BYTES_PER_PARAM = STATE_BYTES_PER_PARAM - 4  # no gradients in a checkpoint
COPY_BACK_SPARE = 1.1
COPY_BACK_EXTRAS = 1 << 30  # samples, records.jsonl, logs
COMMAND_ARM_COPY_BACK = 16 << 30


def copy_back_bytes(spec: dict[str, Any], keep_last: int) -> int:
    """The most bytes a copy-back takes of a run with this spec when the operator set no cap."""
    arm = ArmSpec.model_validate(spec)
    if arm.command is not None:
        return COMMAND_ARM_COPY_BACK
    checkpoint = estimate_params(arm) * CHECKPOINT_BYTES_PER_PARAM
    return int((keep_last + 2) * checkpoint * COPY_BACK_SPARE) + COPY_BACK_EXTRAS


def download_run(url: str, options: dict[str, Any], local: Path, max_bytes: int,
                 skipped: list[str] | None = None) -> int:  # fmt: skip
    """Copy a run's stored files (checkpoints, best.pt, records, samples, a command arm's folder) into
    `local`; returns the file count. A node wrote them: links and paths outside the prefix are refused
    (worker/stored_file.py), at most `max_bytes` are copied in all, and each refusal is named in `skipped`.
    Raises FileNotFoundError when storage holds nothing for the run, StoredFileRefused (nothing copied)
    when the run's folder is a link or lies under one: a node may have swapped it for the controller's files."""
    from worker.checkpoint_store import open_fs
    from worker.stored_file import check_prefix

    fs, root = open_fs(url, options)
    fs.invalidate_cache()
    check_prefix(fs, root)  # before listing it: a listing follows links
    names = [n for n in fs.ls(root, detail=False) if not n.endswith((".partial", "/"))]
    if not names:
        raise FileNotFoundError(f"nothing stored under {url}")
    local.mkdir(parents=True, exist_ok=True)
    copied = _Copied(fs, root, max_bytes, skipped if skipped is not None else [])
    for remote in names:
        name = remote.rstrip("/").rsplit("/", 1)[-1]
        if name == SAMPLES_DIR and fs.isdir(remote):
            _download_samples(copied, remote, local / SAMPLES_DIR)
            continue
        if name == COMMAND_RUN_DIR and fs.isdir(remote):  # a command arm's checkpoints/ folder, as stored
            from worker.folder_mirror import FolderMirror

            mirror = FolderMirror(local, COMMAND_CHECKPOINTS)
            copied.size += mirror.fetch(fs, root, max_bytes - copied.size, copied.skipped)
            copied.count += sum(1 for p in mirror.local.rglob("*") if p.is_file())
            continue
        if name in ("", ".", "..") or fs.isdir(remote):
            continue  # only the run's own flat files; never a path outside `local`
        copied.get(remote, local / name)
    return copied.count


class _Copied:
    """A copy-back's running count and byte budget; refused files are named in `skipped`."""

    def __init__(self, fs: Any, root: str, max_bytes: int, skipped: list[str]) -> None:
        self.fs, self.root, self.max_bytes, self.skipped = fs, root, max_bytes, skipped
        self.size = self.count = 0

    def get(self, remote: str, dest: Path) -> None:
        from worker.stored_file import StoredFileRefused, get_stored

        try:
            self.size += get_stored(self.fs, self.root, remote, dest, self.max_bytes - self.size)
            self.count += 1
        except StoredFileRefused as exc:
            self.skipped.append(str(exc))


def _download_samples(copied: _Copied, remote: str, local: Path) -> None:
    """samples/step_*/ *.png of a run (worker/samples.py); names are checked, so nothing lands outside."""
    fs = copied.fs
    for folder in fs.ls(remote, detail=False):
        step = folder.rstrip("/").rsplit("/", 1)[-1]
        if not SAMPLE_STEP_RE.match(step) or not fs.isdir(folder):
            continue
        for png in fs.ls(folder, detail=False):
            name = png.rstrip("/").rsplit("/", 1)[-1]
            if not SAMPLE_FILE_RE.match(name):
                continue
            (local / step).mkdir(parents=True, exist_ok=True)
            copied.get(png, local / step / name)
