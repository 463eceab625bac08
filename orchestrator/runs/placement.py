"""Placing a run on Ray: the connection to the cluster, the worker's name and directory, the claim that
takes a run out of the queue, and the actor that trains it. Ray is imported lazily (the API must start fast)."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from orchestrator.db.events import record_event
from orchestrator.db.models import Run, utcnow
from orchestrator.db.transitions import transition
from orchestrator.settings import Settings
from orchestrator.storage import worker_data_store, worker_storage
from orchestrator.vocabulary import RunState


def claim_for_launch(session: Session, run: Run, checkpoint_dir: str) -> bool:
    """queued -> starting, if the run is still queued; False when a stop (or anything else) got there first."""
    return transition(
        session,
        run,
        RunState.queued,
        state=RunState.starting,
        checkpoint_dir=checkpoint_dir,
        started_at=run.started_at or utcnow(),
    )


def actor_name(run_id: int, attempt: int) -> str:
    """The worker's Ray name; a new attempt (after a worker died) gets a new name."""
    return f"ablate-run-{run_id}-{attempt}"


def run_dir(settings: Settings, run_id: int) -> Path:
    """Checkpoints and records of one run, the same directory for every attempt."""
    return settings.storage_dir.resolve() / "runs" / str(run_id)


def nonempty(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


def _refresh_ray_auth() -> None:
    """Make an already imported Ray see the auth environment just set (what Ray's own
    `_enable_token_auth` does); a no-op where Ray was not imported yet."""
    import sys

    if "ray" not in sys.modules:
        return
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def connect_ray(settings: Settings, **init_kwargs: Any) -> bool:
    """Join the configured cluster, or start a local Ray (declaring settings.logical_gpus GPUs if > 0).
    True when this call connected (the caller then owns the connection), False when Ray already was."""
    import signal

    token = settings.cluster_token_file if settings.ray_address else None
    if token is not None:
        # Before `import ray`: Ray reads the auth mode and token path from the environment when it is
        # imported (set later, a driver is refused with "Authentication token is missing or incorrect").
        from orchestrator.fleet.ray_cluster import auth_env

        os.environ.update(auth_env(token))
        _refresh_ray_auth()  # for a process that imported Ray already
    import ray

    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"namespace": settings.ray_namespace, **init_kwargs}
    # ray.init replaces the SIGTERM handler with sys.exit; keep the server's (uvicorn shuts down cleanly).
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if in_main else None
    if settings.ray_address:
        ray.init(address=settings.ray_address, **kwargs)
    else:
        if settings.logical_gpus > 0:
            kwargs.setdefault("num_gpus", settings.logical_gpus)
        ray.init(include_dashboard=False, **kwargs)
    if in_main and previous is not None:
        signal.signal(signal.SIGTERM, previous)
    return True


def start_worker(settings: Settings, run: Run, name: str, out_dir: Path, train_fn: str) -> Any:
    """Create the run's worker: a named, detached actor on one GPU (Ray sets CUDA_VISIBLE_DEVICES) and no
    CPU reservation, so four arms run at once on a node whatever its core count."""
    import ray

    from worker.actor import ArmWorker

    return (
        ray.remote(ArmWorker)
        .options(
            name=name,
            namespace=settings.ray_namespace,
            lifetime="detached",
            num_gpus=1,
            num_cpus=0,
            max_concurrency=4,  # poll and request_stop run beside the training thread
            max_restarts=0,  # a lost worker is retried by us, from its checkpoint
        )
        .remote(
            run.id,
            run.spec,
            str(out_dir),
            str(settings.lpips_weights.resolve()) if settings.lpips_weights else None,
            settings.worker_threads,
            train_fn,
            storage=worker_storage(settings, run.checkpoint_url),
            data_store=worker_data_store(settings),
        )
    )


@dataclass
class Worker:
    """A live actor of ours and what we have taken from it."""

    run_id: int
    name: str
    handle: Any
    after_step: int | None
    poll_ref: Any = None
    stop_sent: bool = False
    started: bool = False  # its first poll reply is committed (the run is `running`)
    info: dict[str, Any] = field(default_factory=dict)
    launched_at: float = field(default_factory=time.monotonic)  # time.monotonic() s, for start_timeout_s
    attempt: int = 0  # the run's retries when launched (the worker's upload log is per attempt)
    storage_seen: int = 0  # the newest upload-log entry of this worker stored as an event
    ingest_failures: int = 0  # consecutive replies that could not be stored (not counting DB outages)


def mark_running(session: Session, run: Run, info: dict[str, Any]) -> None:
    """The worker's first reply: where the run landed (GPU, node) and what it runs (versions); starting -> running."""
    run.versions = info.get("provenance") or run.versions
    run.gpu_index = info.get("cuda_visible_devices")
    run.gpu_name = info.get("gpu_name") or run.gpu_name
    run.gpu_uuid = info.get("gpu_uuid")
    run.node = info.get("node")
    # Every node it ran on (a lost node's run resumes elsewhere); hostname and Ray node IP, since
    # machines (namespaces of the test bed, cloned images) can share a hostname.
    where = f"{run.node} ({info['node_ip']})" if info.get("node_ip") else run.node
    if where and (run.nodes or [None])[-1] != where:
        run.nodes = [*(run.nodes or []), where]
    if run.state == RunState.starting:
        run.state = RunState.running
        record_event(
            session,
            run,
            "started",
            f"on GPU {run.gpu_index} ({run.gpu_name or 'logical'}) of {run.node}",
            attempt=run.retries,
            **{k: v for k, v in info.items() if k != "provenance"},
        )
