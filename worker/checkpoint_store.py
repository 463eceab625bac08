"""Durable checkpoint storage: a run's checkpoints copied, in the background, to a store that outlives the node.

The store is an fsspec URL (`file:///path`, `s3://bucket/prefix`, `sftp://user@host[:port]/path`), one
prefix per run. Under it the files keep their local names, so a new node resumes by downloading them
into an empty out_dir and a sweep's copy-back is a download of the prefix (names: worker/run_files.py):

    ckpt_{step:07d}.pt   the newest `keep_last` periodic checkpoints (older ones are pruned)
    best.pt              the best checkpoint so far by the metric the detector judges (worker/run_files.py)
    metrics.jsonl        the trainer's records, and records.jsonl the actor's (uploaded before the
                         checkpoint they end with, so a stored checkpoint always has its records)
    samples/step_{step:07d}/*.png   every evaluation's sample images (worker/samples.py), never pruned,
                         uploaded with the first checkpoint at or past their step

Training never waits for storage: `offer` hard-links the new checkpoint into out_dir/.upload (pruning
cannot delete it under the upload) and returns; one thread uploads the newest pending checkpoint (an
older one not yet started is superseded), retries failures with back-off and logs every attempt for the
controller. Imports no torch and nothing from orchestrator/.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fsspec

from worker.folder_mirror import FolderMirror
from worker.run_files import BEST_NAME, CKPT_GLOB, CKPT_RE, RECORD_FILES, SAMPLE_STEP_RE, SAMPLES_DIR, ckpt_name
from worker.stored_file import StoredFileRefused, get_stored

STAGING = ".upload"
# A put is atomic on object stores; elsewhere a file is written under a temp name and renamed.
OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs"})
# Retry back-off after a failed upload: doubles from 1 s up to 2 min (a store that is down all night
# costs one attempt and one event per 2 min, not a tight loop).
BACKOFF_FIRST_S, BACKOFF_MAX_S = 1.0, 120.0
LOG_KEEP = 50  # storage log entries kept for the controller's poll (it asks about once a second)


def _now() -> str:
    return datetime.now(UTC).isoformat()


def known_hosts_policy(path: Path) -> Any:
    """A paramiko policy that accepts an SFTP server only if its key is in the known-hosts file at path
    (fsspec's default, auto-add, trusts any key; paramiko's client starts with no known keys, so every
    connection is decided here). paramiko is imported only here: a node with a file:// or s3:// store
    needs no SSH stack."""
    import paramiko

    class KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
        def __init__(self) -> None:
            self.keys = paramiko.HostKeys(str(path)) if path.exists() else paramiko.HostKeys()

        def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
            if not self.keys.check(hostname, key):
                raise paramiko.SSHException(
                    f"host key of {hostname} ({key.get_name()} {key.fingerprint}) "
                    f"is not in {path}; add it with ssh-keyscan if it is the right server"
                )

    return KnownHostsPolicy()


def open_fs(url: str, options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """(fsspec filesystem, path inside it) for `url`, a fresh instance (a cached one may hold a dead connection).

    options are fsspec storage options; for sftp, `known_hosts` (default ~/.ssh/known_hosts) decides which
    server keys are accepted, and `key_filename` names the client key.
    """
    opts = dict(options or {})
    if url.startswith(("sftp://", "ssh://")):
        known = Path(opts.pop("known_hosts", None) or Path.home() / ".ssh" / "known_hosts").expanduser()
        opts["host_key_policy"] = known_hosts_policy(known)
        opts.setdefault("timeout", 30)
    return fsspec.url_to_fs(url, skip_instance_cache=True, **opts)


def _protocol(fs: Any) -> str:
    proto = fs.protocol
    return proto if isinstance(proto, str) else proto[0]


def stored_checkpoints(fs: Any, root: str) -> list[tuple[int, str]]:
    """(step, path) of the periodic checkpoints under root, oldest first; [] when root does not exist."""
    fs.invalidate_cache()
    try:
        names = fs.ls(root, detail=False)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        m = CKPT_RE.match(name.rstrip("/").rsplit("/", 1)[-1])
        if m:
            found.append((int(m.group(1)), name))
    return sorted(found)


def _local_steps(out_dir: Path) -> list[int]:
    return sorted(int(m.group(1)) for p in out_dir.glob(CKPT_GLOB) if (m := CKPT_RE.match(p.name)))


@dataclass(frozen=True)
class StoreConfig:
    """Where one run's checkpoints go; built by the controller, handed to the worker as a dict."""

    url: str  # this run's prefix, e.g. s3://bucket/ablate/run-17-20261122T142301
    options: dict[str, Any] = field(default_factory=dict)  # fsspec storage options (never secrets)
    keep_last: int = 2  # periodic checkpoints kept in storage besides best.pt
    flush_timeout_s: float = 900.0  # at the end of a run: how long to wait for the last upload

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StoreConfig:
        return cls(**d)


@dataclass
class _Item:
    """A checkpoint waiting to be stored: its staged hard link and the record files as they were then."""

    step: int
    staged: Path
    records: dict[str, bytes]


class CheckpointStore:
    """Uploads one run's checkpoints in a background thread and downloads them for a resume.

    `log` entries ({"seq", "time", "kind", "message", "data"}) describe every stored checkpoint, failed
    attempt and fetch; the controller turns them into events.
    """

    def __init__(self, config: StoreConfig, out_dir: Path) -> None:
        self.config = config
        self.out_dir = Path(out_dir)
        self._cond = threading.Condition()
        self._latest: _Item | None = None  # newest checkpoint not stored yet
        self._best: _Item | None = None  # newest best checkpoint not stored yet as best.pt
        self._busy = False
        self._closed = False
        self._seq = 0
        self._log: list[dict[str, Any]] = []
        self._status: dict[str, Any] = {
            "url": config.url,
            "stored_step": None,
            "stored_at": None,
            "failures": 0,  # failed attempts in a row (0 after a success)
            "failing_since": None,
            "last_error": None,
        }
        self._fs: Any = None
        self._root = ""
        self._thread: threading.Thread | None = None
        self._offers = 0
        self._samples_stored: set[str] = set()  # sample folders uploaded by this process (upload thread only)
        self.mirror: FolderMirror | None = None  # a command arm's checkpoints/ folder, stored as it is
        # Links staged by a worker that died mid-upload: they would pin pruned checkpoints' disk space.
        shutil.rmtree(self.out_dir / STAGING, ignore_errors=True)

    # -- called by the worker ------------------------------------------------------------------

    def offer(self, step: int, is_best: bool) -> None:
        """The trainer just wrote checkpoint `step` (and best.pt if is_best): store it, in the background."""
        src = self.out_dir / ckpt_name(step)
        if not src.exists():  # a synthetic stream (benchmarks) writes no files
            return
        with self._cond:
            stored = self._status["stored_step"]
            if stored is not None and step <= stored:  # a re-sent final record: already there
                return
            self._offers += 1
            n = self._offers
        staging = self.out_dir / STAGING
        staging.mkdir(exist_ok=True)
        staged = staging / f"{src.name}.{n}"  # one link per offer: each item owns (and deletes) its own
        try:
            os.link(src, staged)
        except OSError:  # no hard links on this filesystem: a copy (slower, still correct)
            shutil.copy2(src, staged)
        records = {f: (self.out_dir / f).read_bytes() for f in RECORD_FILES if (self.out_dir / f).exists()}
        item = _Item(step, staged, records)
        with self._cond:
            old = [self._latest, self._best]
            self._latest = item
            if is_best:
                self._best = item
            for o in old:
                self._release(o)
            self._start()
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything offered is stored; False when `timeout` (default flush_timeout_s) ran out."""
        limit = self.config.flush_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + limit
        with self._cond:
            while self._busy or self._latest is not None or self._best is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._note("checkpoint.store_abandoned", f"gave up waiting after {limit:g} s for the upload of "
                               f"step {self._pending_step()}", step=self._pending_step())
                    return False
                self._cond.wait(min(left, 1.0))
        return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def status(self) -> dict[str, Any]:
        """What the controller shows: stored step and time, failing since, the last error, and the log."""
        with self._cond:
            return {**self._status, "pending_step": self._pending_step(), "log": list(self._log)}

    def fetch_latest_retrying(self, timeout: float | None = None) -> dict[str, Any] | None:
        """fetch_latest, retried with back-off for up to `timeout` s (default flush_timeout_s) while the
        store fails; each failure is logged. Raises the last error when time runs out: starting over from
        step 0 while the run's checkpoints sit in an unreachable store would throw its progress away."""
        deadline = time.monotonic() + (self.config.flush_timeout_s if timeout is None else timeout)
        delay, attempt = BACKOFF_FIRST_S, 0
        while True:
            try:
                return self.fetch_latest()
            except Exception as exc:
                attempt += 1
                error = f"{type(exc).__name__}: {exc}".strip()[:500]
                left = deadline - time.monotonic()
                retry = left > delay and not isinstance(exc, StoredFileRefused)  # a refusal is what is stored
                with self._cond:
                    self._note("checkpoint.fetch_failed", f"reading {self.config.url} failed (attempt {attempt}"
                               + (f", retry in {delay:g} s" if retry else ", giving up") + f"): {error}",
                               attempt=attempt, error=error)
                if not retry:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)

    def fetch_latest(self) -> dict[str, Any] | None:
        """Download the newest stored checkpoint (with best.pt and the record files) into out_dir when it
        is newer than the newest local one; returns what was fetched, None when nothing was newer."""
        fs, root = open_fs(self.config.url, self.config.options)
        stored = stored_checkpoints(fs, root)
        local = _local_steps(self.out_dir)
        if not stored or (local and local[-1] >= stored[-1][0]):
            return None
        step, path = stored[-1]
        t0 = time.perf_counter()
        size = self.mirror.fetch(fs, root) if self.mirror is not None else 0
        names = [(path, ckpt_name(step))]
        names += [(f"{root}/{n}", n) for n in (BEST_NAME, *RECORD_FILES) if fs.exists(f"{root}/{n}")]
        # The checkpoint last: an interrupted fetch leaves no checkpoint without its records.
        for remote, name in reversed(names):  # another node wrote them: no link is followed
            size += get_stored(fs, root, remote, self.out_dir / name)
        seconds = time.perf_counter() - t0
        fetched = {"step": step, "url": self.config.url, "bytes": size, "seconds": round(seconds, 3)}
        with self._cond:
            self._status.update(stored_step=step)
            self._note("checkpoint.fetched", f"resumed from storage: step {step} ({size / 1e6:.1f} MB in "
                       f"{seconds:.1f} s) from {self.config.url}", **fetched)
        return fetched

    # -- the upload thread -----------------------------------------------------------------------

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="checkpoint-upload", daemon=True)
            self._thread.start()

    def _pending_step(self) -> int | None:
        steps = [i.step for i in (self._latest, self._best) if i is not None]
        return max(steps) if steps else None

    def _release(self, item: _Item | None) -> None:
        """Delete the staged link of an item no slot refers to any more (call with the lock held)."""
        if item is not None and item is not self._latest and item is not self._best:
            item.staged.unlink(missing_ok=True)

    def _note(self, kind: str, message: str, **data: Any) -> None:
        self._seq += 1
        self._log.append({"seq": self._seq, "time": _now(), "kind": kind, "message": message, "data": data})
        del self._log[:-LOG_KEEP]

    def _loop(self) -> None:
        delay = BACKOFF_FIRST_S
        while True:
            with self._cond:
                while not self._closed and self._latest is None and self._best is None:
                    self._cond.wait()
                if self._closed:
                    return
                latest, best = self._latest, self._best
                self._latest = self._best = None
                self._busy = True
            t0 = time.perf_counter()
            try:
                size = self._upload(latest, best)
            except Exception as exc:  # noqa: BLE001 - any failure of the store is retried, never fatal
                self._fs = None  # reconnect next time
                error = f"{type(exc).__name__}: {exc}".strip()[:500]
                with self._cond:
                    # Back in their slots, unless newer checkpoints arrived meanwhile (then dropped).
                    self._latest = self._latest or latest
                    self._best = self._best or best
                    self._release(latest)
                    self._release(best)
                    st = self._status
                    st["failures"] += 1
                    st["failing_since"] = st["failing_since"] or _now()
                    st["last_error"] = error
                    step = self._pending_step()
                    self._note(
                        "checkpoint.store_failed",
                        f"storing step {step} in {self.config.url} failed (attempt {st['failures']}, "
                        f"retry in {delay:g} s): {error}",
                        step=step,
                        attempt=st["failures"],
                        retry_in_s=delay,
                        error=error,
                    )
                    self._busy = False
                    self._cond.notify_all()
                    # Back-off: close() ends it, a newer checkpoint does not (the store is still down).
                    deadline = time.monotonic() + delay
                    while not self._closed and (left := deadline - time.monotonic()) > 0:
                        self._cond.wait(left)
                delay = min(delay * 2, BACKOFF_MAX_S)
                continue
            delay = BACKOFF_FIRST_S
            seconds = time.perf_counter() - t0
            step = latest.step
            with self._cond:
                self._release(latest)
                self._release(best)
                self._status.update(stored_step=step, stored_at=_now(), failures=0, failing_since=None,
                                    last_error=None)
                self._note(
                    "checkpoint.stored",
                    f"step {step} stored in {self.config.url} ({size / 1e6:.1f} MB in {seconds:.1f} s)"
                    + (" as best.pt too" if best is not None else ""),
                    step=step,
                    best_step=best.step if best is not None else None,
                    bytes=size,
                    seconds=round(seconds, 3),
                    url=self.config.url,
                )
                self._busy = False
                self._cond.notify_all()

    def _upload(self, latest: _Item, best: _Item | None) -> int:
        """One upload cycle: record files, the checkpoint, best.pt, then prune. Returns bytes sent."""
        if self._fs is None:
            self._fs, self._root = open_fs(self.config.url, self.config.options)
        fs, root = self._fs, self._root
        atomic = _protocol(fs) in OBJECT_STORES
        if not atomic:
            fs.makedirs(root, exist_ok=True)  # (on an object store this would create a bucket: never)
        size = 0
        for name, data in latest.records.items():
            self._put_bytes(fs, f"{root}/{name}", data, atomic)
            size += len(data)
        size += self._upload_samples(fs, root, latest.step, atomic)
        if self.mirror is not None:  # this cycle's checkpoint files go below under ablate's names
            skip = {i.staged.stat().st_ino for i in (latest, best) if i is not None}
            copy = lambda local, remote: self._copy_file(fs, local, remote, atomic)  # noqa: E731
            size += self.mirror.sync(fs, root, copy, skip, latest.staged.stat().st_mtime_ns)
        ckpt_remote = f"{root}/{ckpt_name(latest.step)}"
        self._put_file(fs, latest.staged, ckpt_remote, atomic)
        size += latest.staged.stat().st_size
        if best is not None:
            if best.step == latest.step and atomic:
                fs.copy(ckpt_remote, f"{root}/{BEST_NAME}")  # server-side copy: no second upload
            else:
                self._put_file(fs, best.staged, f"{root}/{BEST_NAME}", atomic)
                size += best.staged.stat().st_size
        for _, path in stored_checkpoints(fs, root)[: -self.config.keep_last]:
            fs.rm_file(path)
        return size

    def _upload_samples(self, fs: Any, root: str, up_to_step: int, atomic: bool) -> int:
        """Sample folders of steps up to `up_to_step` not stored yet (a later step's folder may be being
        written by the trainer right now). A folder counts as stored only once all its files are."""
        size = 0
        for folder in sorted((self.out_dir / SAMPLES_DIR).glob("step_*")):
            m = SAMPLE_STEP_RE.match(folder.name)
            if m is None or int(m.group(1)) > up_to_step or folder.name in self._samples_stored:
                continue
            remote = f"{root}/{SAMPLES_DIR}/{folder.name}"
            if not atomic:
                fs.makedirs(remote, exist_ok=True)
            for png in sorted(folder.glob("*.png")):
                data = png.read_bytes()
                self._put_bytes(fs, f"{remote}/{png.name}", data, atomic)
                size += len(data)
            self._samples_stored.add(folder.name)
        return size

    @staticmethod
    def _put_file(fs: Any, local: Path, remote: str, atomic: bool) -> None:
        if atomic:
            fs.put_file(str(local), remote)
            return
        tmp = remote + ".partial"
        if _protocol(fs) == "file":
            Path(tmp).unlink(missing_ok=True)
            try:
                os.link(local, tmp)  # same filesystem (the single-host default): no copy at all
            except OSError:
                fs.put_file(str(local), tmp)
        else:
            fs.put_file(str(local), tmp)
        _replace(fs, tmp, remote)

    @staticmethod
    def _copy_file(fs: Any, local: Path, remote: str, atomic: bool) -> None:
        """A copy, never a hard link (a file the script may rewrite in place); parent folders made."""
        if not atomic:
            fs.makedirs(remote.rsplit("/", 1)[0], exist_ok=True)
        fs.put_file(str(local), remote if atomic else remote + ".partial")
        if not atomic:
            _replace(fs, remote + ".partial", remote)

    @staticmethod
    def _put_bytes(fs: Any, remote: str, data: bytes, atomic: bool) -> None:
        if atomic:
            fs.pipe_file(remote, data)
            return
        tmp = remote + ".partial"
        fs.pipe_file(tmp, data)
        _replace(fs, tmp, remote)


def _replace(fs: Any, src: str, dst: str) -> None:
    """Rename src over dst. SFTP's plain rename refuses an existing target; the posix-rename extension
    (OpenSSH) replaces atomically."""
    if _protocol(fs) in ("sftp", "ssh"):
        fs.ftp.posix_rename(src, dst)
    else:
        fs.mv(src, dst)
