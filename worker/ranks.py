"""Starting a data-parallel arm's ranks from its actor and handing rank 0's records on.

An arm with `gpus: N` (N > 1) trains as N processes that its actor (worker/actor.py) starts, rank r
pinned to the r-th of the N GPUs Ray gave the actor through CUDA_VISIBLE_DEVICES. The ranks meet in a
process group (worker/world.py: NCCL on GPUs, gloo on CPU) through a file store in the run's directory
and run the same `train_arm`; rank 0 alone evaluates and writes, and its records come back to the actor
as JSON lines, to be offered like a one-GPU arm's.

The arm is whole or nothing. A rank that fails or dies ends every rank, and the actor reports one error
naming the rank (the run fails with it; no half of an arm trains on). A resume restores every rank from
rank 0's checkpoint, and an actor that dies (killed, or its node's Ray gone) takes its ranks with it:
the kernel ends a rank whose starting thread ends (PR_SET_PDEATHSIG), and the end of a rank's stdin
means its actor is gone.

    python -m worker.ranks RANK     (started by `run_ranks`; the job comes as one JSON line on stdin)
"""

from __future__ import annotations

import faulthandler
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from worker.failure import RankFailed, describe_error
from worker.node_ray import end_with_parent

# How long a collective waits for the other ranks before the arm fails: longer than rank 0's evaluation
# and checkpoint at seed size, while the other ranks wait at the next step's all-reduce.
RANK_TIMEOUT_S = 1800.0
POLL_S = 0.5  # the actor checks its stop request and its ranks' health this often
STOP_LINE = b"stop\n"


@dataclass(frozen=True)
class RankJob:
    """What every rank trains: ArmWorker's arguments, as JSON."""

    spec: dict[str, Any]
    out_dir: str
    lpips_weights: str | None
    data_store: dict[str, Any] | None
    torch_threads: int
    train_fn: str
    size: int
    init_file: str  # the process group's file store, new for every start
    devices: list[str]  # rank r's CUDA_VISIBLE_DEVICES; [] where the actor has none
    compile_cache: dict[str, Any] | None = None  # worker.compile_cache.CompileCache as a dict


def rank_devices(size: int) -> list[str]:
    """One of the actor's GPUs per rank (Ray's CUDA_VISIBLE_DEVICES), [] where it lists none (CPU)."""
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if visible and len(visible) < size:
        raise RankFailed(f"the arm asks for {size} GPUs but its worker sees {len(visible)} ({','.join(visible)})")
    return visible[:size]


def new_job(out_dir: Path, size: int, **kwargs: Any) -> RankJob:
    out_dir.mkdir(parents=True, exist_ok=True)
    init_file = out_dir / f".ranks-{uuid.uuid4().hex}"  # a store file left by a killed start is never reused
    return RankJob(out_dir=str(out_dir), size=size, init_file=str(init_file), devices=rank_devices(size), **kwargs)


def run_ranks(job: RankJob, should_stop: Callable[[], bool]) -> Iterator[dict[str, Any]]:
    """Start the ranks, yield rank 0's records, and return when every rank is done; RankFailed (every rank
    ended) when one fails or dies. A stop request is passed to every rank (they agree on the step)."""
    lines: queue.Queue[tuple[int, bytes | None]] = queue.Queue()
    procs: list[subprocess.Popen[bytes]] = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        for rank in range(job.size):
            rank_env = {**env, "CUDA_VISIBLE_DEVICES": job.devices[rank]} if job.devices else env
            proc = subprocess.Popen(
                [sys.executable, "-m", "worker.ranks", str(rank)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                env=rank_env, preexec_fn=end_with_parent(signal.SIGKILL),  # a killed actor leaves no rank behind
            )
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(json.dumps(asdict(job)).encode() + b"\n")
            proc.stdin.flush()
            procs.append(proc)
            threading.Thread(target=_read_lines, args=(rank, proc.stdout, lines), daemon=True).start()
        yield from _follow(procs, lines, should_stop)
    finally:
        for proc in procs:  # a failure, or the actor giving up on the stream: no rank trains on
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        Path(job.init_file).unlink(missing_ok=True)


def _read_lines(rank: int, out: IO[bytes], lines: queue.Queue[tuple[int, bytes | None]]) -> None:
    for line in out:
        lines.put((rank, line))
    lines.put((rank, None))


def _follow(
    procs: list[subprocess.Popen[bytes]], lines: queue.Queue[tuple[int, bytes | None]], should_stop: Callable[[], bool]
) -> Iterator[dict[str, Any]]:
    done: set[int] = set()
    stop_sent = False
    while len(done) < len(procs):
        if not stop_sent and should_stop():
            stop_sent = True
            for proc in procs:
                _send_stop(proc)
        try:
            rank, line = lines.get(timeout=POLL_S)
        except queue.Empty:
            continue
        if line is None:  # its stdout closed: it exited (or is about to)
            code = procs[rank].wait()
            if rank not in done:
                how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                raise RankFailed(f"rank {rank} of {len(procs)} {how} before finishing; the whole arm ends")
            continue
        message = json.loads(line)
        if "record" in message:
            yield message["record"]
        elif "error" in message:
            raise RankFailed(message["error"])
        elif message.get("done"):
            done.add(rank)


def _send_stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        assert proc.stdin is not None
        proc.stdin.write(STOP_LINE)
        proc.stdin.flush()
    except (BrokenPipeError, OSError):  # it ended already: _follow hears of it
        pass


# -- one rank ----------------------------------------------------------------------------------------


def _lines(raw: IO[bytes]) -> Iterator[bytes]:
    """Lines of an unbuffered file, read without the lock a buffered sys.stdin holds while it waits: a
    DataLoader worker forked meanwhile closes sys.stdin first thing, and would wait on that lock forever."""
    pending = b""
    while chunk := raw.read(1 << 16):
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            yield line + b"\n"


def _watch_control(lines: Iterator[bytes], stop: threading.Event) -> None:
    """"stop" lines set `stop`; the end of them means the actor is gone, and a rank never trains unseen."""
    for line in lines:
        if line == STOP_LINE:
            stop.set()
    os._exit(1)


def rank_main(rank: int) -> int:
    control = _lines(os.fdopen(os.dup(0), "rb", buffering=0))
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # what the rank's own code or children see as stdin
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the process's stdin for its whole life
    job = RankJob(**json.loads(next(control)))
    # The protocol owns the real stdout; anything a library prints goes to stderr (the actor's log).
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(message: dict[str, Any]) -> None:
        out.write(json.dumps(message).encode() + b"\n")
        out.flush()

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <rank>`: its stacks in the worker's log (a hung collective)
    stop = threading.Event()
    threading.Thread(target=_watch_control, args=(control, stop), daemon=True).start()
    try:
        import importlib

        import torch

        from model.spec import ArmSpec
        from worker.world import World

        if job.torch_threads > 0:
            torch.set_num_threads(job.torch_threads)
        device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        world = World.join(rank, job.size, job.init_file, device, RANK_TIMEOUT_S)
        try:
            spec = ArmSpec.model_validate(job.spec)
            module, _, func = job.train_fn.partition(":")
            train_arm = getattr(importlib.import_module(module), func)
            data: dict[str, Any] = {"data_store": job.data_store} if spec.data.url is not None else {}
            if job.compile_cache is not None:
                data["compile_cache"] = job.compile_cache
            weights = Path(job.lpips_weights) if job.lpips_weights else None
            stream = train_arm(
                spec, Path(job.out_dir), device=str(device), should_stop=stop.is_set, lpips_weights=weights,
                world=world, **data,
            )
            for record in stream:
                send({"record": dict(record)})  # NaN as JSON's NaN: the actor stores it as a run's records are
        finally:
            world.leave()
    except BaseException as exc:  # noqa: BLE001 - every failure reaches the actor, then the run
        send({"error": f"rank {rank} of {job.size}: {describe_error(exc)}"})
        return 1
    send({"done": True})
    return 0


if __name__ == "__main__":
    code = rank_main(int(sys.argv[1]))
    sys.stderr.flush()
    os._exit(code)  # not sys.exit: interpreter shutdown would wait for the control thread's read
