"""The Ray actor that trains one arm on the one GPU Ray gave it and keeps its metric records for the controller.

Training runs in a thread inside the actor; the controller long-polls `poll(after_step)` for records newer
than the last one it stored. Every record is also appended to `out_dir/records.jsonl` before it is offered,
so a new actor for the same run (after a worker died) or a restarted controller gets back every record the
DB may have missed. Imports model/ and worker/ only (plus ray and torch), never orchestrator/.
"""

from __future__ import annotations

import errno
import inspect
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from model.spec import ArmSpec
from worker.failure import Described, describe_error, masked
from worker.protocol import CheckpointRecord, first_error, jsonable
from worker.run_files import METRICS_NAME, RECORDS_NAME, RECORDS_PER_POLL

# How long a worker waits for space on a full disk before its run fails (the operator's time to react).
DISK_FULL_WAIT_S = 600.0


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a kill -9
                continue
    return out


def load_records(out_dir: Path) -> list[dict[str, Any]]:
    """Records already produced for this run by earlier workers, in step order, one per step.

    Ours (records.jsonl, written after each yield) plus the trainer's metrics.jsonl lines that have
    their checkpoint on disk: the trainer writes that line just before the checkpoint, so a worker
    killed after the checkpoint but before our own append still hands the record on (resume starts
    after that step and would never yield it again).
    """
    from worker.checkpoint import periodic_checkpoints

    by_step = {int(r["step"]): r for r in _read_jsonl(out_dir / RECORDS_NAME)}
    ckpts = periodic_checkpoints(out_dir)
    newest = ckpts[-1][0] if ckpts else -1
    for rec in _read_jsonl(out_dir / METRICS_NAME):
        step = int(rec["step"])
        if step <= newest and step not in by_step:
            by_step[step] = jsonable(rec)
    return [by_step[s] for s in sorted(by_step)]


def gpu_info() -> dict[str, Any]:
    """What this process sees: Ray's CUDA_VISIBLE_DEVICES and, on a real GPU, its name and UUID."""
    info: dict[str, Any] = {
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "pid": os.getpid(),
        "node": socket.gethostname(),
        "gpu_name": None,
        "gpu_uuid": None,
    }
    import torch

    from worker.checkpoint import provenance

    info["provenance"] = provenance()  # library versions and git commit, stored on the run
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu_name"] = props.name
        uuid = getattr(props, "uuid", None)
        info["gpu_uuid"] = f"GPU-{uuid}" if uuid is not None else None
    return info


class ArmWorker:
    """One run on one GPU. Wrapped with `ray.remote(num_gpus=1, ...)` by the node agent (worker/agent.py).

    Args:
        run_id: the DB id of the run (for logs only).
        spec: the resolved ArmSpec: as the node agent validated it (worker/protocol.py WorkerArgs), or as a
            dict (exactly as stored on the run), validated here.
        out_dir: checkpoints and records.jsonl of this run; the same directory across retries.
        lpips_weights: local AlexNet weights for LPIPS, or None (the spec decides stand-in or error).
        torch_threads: intra-op threads for this worker (0 = torch's default).
        train_fn: "module:function" with train_arm's signature; benchmarks swap in a synthetic stream.
        storage: worker.checkpoint_store.StoreConfig as a dict: checkpoints are also stored there (in the
            background), and a worker whose out_dir lacks the newest stored checkpoint fetches it first.
        data_store: worker.data_fetch.DataStore as a dict: how this node reaches a spec's data.url
            (storage options, its data cache); handed to train_fn only for a spec with data.url.
        code_archive: a command arm's code as the controller shipped it to this node (a tar named by its
            SHA-256); None: the spec's `code` directory is read where it is.
        compile_cache: worker.compile_cache.CompileCache as a dict: the node's compile cache directory and
            the store compiled arms share; handed to train_fn only when set.
        evaluation: worker.protocol.EvaluationArgs (or its dict): this worker evaluates a stored checkpoint
            again (train_fn worker.evaluation:evaluate_arm, handed it) and trains nothing.
        end_evaluation: worker.protocol.EndEvaluation (or its dict): a deciding grid's run on one GPU also
            evaluates its last checkpoint before it ends, with the model loaded; handed to a train_fn that takes it.
    """

    def __init__(
        self,
        run_id: int,
        spec: ArmSpec | dict[str, Any],
        out_dir: str,
        lpips_weights: str | None = None,
        torch_threads: int = 0,
        train_fn: str = "worker.train:train_arm",
        storage: dict[str, Any] | None = None,
        data_store: dict[str, Any] | None = None,
        code_archive: str | None = None,
        compile_cache: dict[str, Any] | None = None,
        evaluation: Any = None,
        end_evaluation: Any = None,
    ) -> None:
        self.run_id = run_id
        self.out_dir = Path(out_dir)
        self._lpips_weights = Path(lpips_weights) if lpips_weights else None
        self._torch_threads = torch_threads
        self._train_fn = train_fn
        self._data_store = data_store
        self._code_archive = Path(code_archive) if code_archive else None
        self._compile_cache = compile_cache
        self._evaluation = evaluation.model_dump() if hasattr(evaluation, "model_dump") else evaluation
        self._end_evaluation = end_evaluation.model_dump() if hasattr(end_evaluation, "model_dump") else end_evaluation
        self._cond = threading.Condition()
        self._records: list[dict[str, Any]] = []
        self._state = "running"  # running | done | error
        self._error: str | None = None
        self._ended_by: str | None = None  # a command arm: what ended its process (model.spec CommandEnd)
        self._stop = threading.Event()
        self._info: dict[str, Any] = {"pid": os.getpid(), "node": socket.gethostname()}
        self._store = None
        try:
            self._spec = ArmSpec.model_validate(spec)  # an ArmSpec the agent validated is taken as it is
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self._records = load_records(self.out_dir)
            self._info = gpu_info()
            if storage is not None:
                from worker.checkpoint_store import CheckpointStore, StoreConfig

                self._store = CheckpointStore(StoreConfig.from_dict(storage), self.out_dir)
                if self._spec.command is not None:  # the script's whole checkpoints/ folder is stored, restored
                    from worker.folder_mirror import FolderMirror
                    from worker.run_files import COMMAND_CHECKPOINTS

                    self._store.mirror = FolderMirror(self.out_dir, COMMAND_CHECKPOINTS)
        except Exception as exc:
            # A directory it cannot write, a bad storage setting: any retry would fail the same way, so
            # the actor stays up and `poll` reports the error (the run fails at once, with the reason)
            # instead of dying as a lost worker that would be re-queued.
            self._state, self._error = "error", self._describe(exc)
            return
        self._resumed_records = len(self._records)
        self._thread = threading.Thread(target=self._train, name=f"train-run-{run_id}", daemon=True)
        self._thread.start()

    # -- training thread -------------------------------------------------------------------------

    def _train(self) -> None:
        try:
            import importlib

            import torch

            self._fetch_stored()
            module, _, func = self._train_fn.partition(":")
            train_arm = getattr(importlib.import_module(module), func)
            if self._torch_threads > 0:
                torch.set_num_threads(self._torch_threads)
            spec = self._spec
            device = "cuda" if torch.cuda.is_available() else "cpu"
            # Only with data.url: a benchmark's synthetic train_fn keeps train_arm's older signature.
            data: dict[str, Any] = {"data_store": self._data_store} if spec.data.url is not None else {}
            if self._compile_cache is not None:
                data["compile_cache"] = self._compile_cache
            if self._evaluation is not None:
                data["evaluation"] = self._evaluation
            if self._end_evaluation is not None and "end_evaluation" in inspect.signature(train_arm).parameters:
                data["end_evaluation"] = self._end_evaluation  # a synthetic train_fn without it: a job evaluates
            command = None
            if spec.command is not None:  # the researcher's own trainer, with train_arm's record contract
                from worker.command import CommandArm

                command = CommandArm(spec, self.out_dir, self._stop.is_set, list(self._records), self._code_archive)
                stream = command.records()
            elif spec.gpus > 1:  # data-parallel: one process per GPU, rank 0's records come back here
                from worker.ranks import new_job, run_ranks

                job = new_job(
                    self.out_dir,
                    spec.gpus,
                    spec=spec.model_dump(mode="json"),
                    lpips_weights=str(self._lpips_weights) if self._lpips_weights else None,
                    data_store=self._data_store,
                    torch_threads=self._torch_threads,
                    train_fn=self._train_fn,
                    compile_cache=self._compile_cache,
                )
                stream = run_ranks(job, self._stop.is_set)
            else:
                stream = train_arm(
                    spec,
                    self.out_dir,
                    device=device,
                    should_stop=self._stop.is_set,
                    lpips_weights=self._lpips_weights,
                    **data,
                )
            with (self.out_dir / RECORDS_NAME).open("a+") as fh:
                # A line cut short by a kill -9 is ended first, so our first record is not glued onto it.
                if fh.tell() > 0:
                    fh.seek(fh.tell() - 1)
                    if fh.read(1) != "\n":
                        fh.write("\n")
                for record in stream:
                    rec = jsonable(dict(record))
                    try:  # what the controller would refuse (and the node with it) fails the run here, named
                        CheckpointRecord.model_validate(rec)
                    except ValidationError as exc:
                        raise Described(f"a record of step {rec.get('step')!r} breaks the protocol: "
                                        f"{first_error(exc)}") from None
                    # Durable before it is offered: a restarted controller or worker re-reads the file.
                    self._append_durably(fh, json.dumps(rec) + "\n")
                    with self._cond:
                        self._records.append(rec)
                        self._cond.notify_all()
                    if self._store is not None:  # in the background: training goes on at once
                        self._store.offer(int(rec["step"]), bool(rec.get("is_best")))
            if self._store is not None:
                self._store.flush()  # "done" lets the controller end this actor: the last upload first
            with self._cond:
                self._state = "done"
                self._ended_by = command.ended_by if command is not None else None
                self._cond.notify_all()
        except BaseException as exc:  # the controller reports it; the actor itself stays up to be polled
            if self._store is not None:
                self._store.flush()
            with self._cond:
                self._state = "error"
                self._error = self._describe(exc)
                self._cond.notify_all()

    def _describe(self, exc: BaseException) -> str:
        """describe_error with the command arm's env values masked: they stay on this node."""
        command = getattr(getattr(self, "_spec", None), "command", None)
        return masked(describe_error(exc), command.env.values() if command is not None else ())

    def _append_durably(self, fh: Any, line: str) -> None:
        """Append and fsync one record line. A full disk is waited out (up to DISK_FULL_WAIT_S, checking
        every second; a stop request ends the wait) instead of failing the run.

        Written with os.write on the append-mode descriptor, past the text buffer: what a full disk
        refused is simply written later, after the part that went in (no duplicate, no torn line).
        """
        fh.flush()  # the text layer holds nothing of ours from here on
        data, waited = line.encode(), 0.0
        while data:
            try:
                data = data[os.write(fh.fileno(), data) :]
            except OSError as exc:
                if exc.errno != errno.ENOSPC or waited >= DISK_FULL_WAIT_S or self._stop.is_set():
                    raise
                time.sleep(1.0)
                waited += 1.0
        while True:
            try:
                os.fsync(fh.fileno())
                return
            except OSError as exc:
                if exc.errno != errno.ENOSPC or waited >= DISK_FULL_WAIT_S or self._stop.is_set():
                    raise
                time.sleep(1.0)
                waited += 1.0

    def _fetch_stored(self) -> None:
        """A new node (or one that lost its disk) resumes from the newest checkpoint in storage."""
        if self._store is None or self._store.fetch_latest_retrying() is None:
            return
        fetched = load_records(self.out_dir)
        with self._cond:
            by_step = {int(r["step"]): r for r in [*fetched, *self._records]}
            self._records = [by_step[s] for s in sorted(by_step)]
            self._cond.notify_all()

    # -- called by the controller ----------------------------------------------------------------

    def poll(self, after_step: int | None, wait_s: float = 1.0) -> dict[str, Any]:
        """Records with step > after_step (all when None; the first RECORDS_PER_POLL, the state `running`
        while more are left), waiting up to wait_s seconds for something new.

        Returns {"info": gpu_info(), "records": [...], "state": running|done|error, "error": str|None,
        "stopping": bool, "ended_by": a command arm's CommandEnd or None, "storage": CheckpointStore.status()
        or None}.
        """
        floor = -1 if after_step is None else after_step

        def news() -> list[dict[str, Any]]:
            return [r for r in self._records if int(r["step"]) > floor]

        with self._cond:
            if self._state == "running" and not news():
                self._cond.wait(timeout=wait_s)
            records = news()
            more = len(records) > RECORDS_PER_POLL  # the rest on the next polls; done only once all are sent
            return {
                "info": self._info,
                "records": records[:RECORDS_PER_POLL],
                "state": "running" if more else self._state,
                "error": self._error,
                "stopping": self._stop.is_set(),
                "ended_by": self._ended_by,
                "storage": self._store.status() if self._store is not None else None,
            }

    def request_stop(self) -> None:
        """Graceful stop: train_arm writes a final checkpoint, yields its record, and returns."""
        self._stop.set()

    def ping(self) -> dict[str, Any]:
        return self._info
