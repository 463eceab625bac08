"""Placing a run on a node: the worker's name and directory, the claim that takes a run out of the queue,
the record of which node holds which attempt, and what the node's agent builds the worker from. The
controller never imports Ray: nodes run it.

The controller owns placement: a node holds the runs the controller placed there, by run id and attempt
(a `placed` event, committed before the node is asked to start the worker; `started` events of runs
launched before placements were recorded count too). A worker a node names that was never placed there is
not its to hold (`not_placed`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from model.spec import ArmSpec
from orchestrator.db.events import record_event
from orchestrator.db.models import Event, Run, utcnow
from orchestrator.db.transitions import transition
from orchestrator.runs.in_training import end_evaluation_of
from orchestrator.runs.storage import worker_compile_cache, worker_data_store, worker_storage
from orchestrator.settings import Settings
from orchestrator.vocabulary import RunState
from worker.protocol import WorkerArgs
from worker.worker_names import parse_worker_name


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


PLACEMENT_EVENTS = ("placed", "started")  # where a run's attempt went: placed at launch, started at its first reply


def record_placement(session: Session, run: Run, node: str, name: str) -> None:
    """The run's current attempt goes to `node`: on record (the caller commits) before the node holds it."""
    record_event(session, run, "placed", f"attempt {run.retries} placed on node {node} as {name}",
                 attempt=run.retries, node_name=node, worker=name)


def not_placed(session: Session, node: str, names: list[str]) -> list[str]:
    """The worker names among `names` that the controller never placed on `node` (each run id and
    attempt checked against the placement events), in their order."""
    wanted = {name: parse_worker_name(name) for name in names}
    run_ids = sorted({parsed[0] for parsed in wanted.values() if parsed})
    placed: set[tuple[int, int]] = set()
    for start in range(0, len(run_ids), 1000):  # bind parameters per statement stay few
        rows = session.execute(
            select(Event.run_id, Event.data).where(
                Event.run_id.in_(run_ids[start : start + 1000]), Event.kind.in_(PLACEMENT_EVENTS)
            )
        )
        for run_id, data in rows:
            if (data or {}).get("node_name") == node and isinstance((data or {}).get("attempt"), int):
                placed.add((run_id, data["attempt"]))
    return [name for name, parsed in wanted.items() if parsed is None or parsed not in placed]


def run_dir(settings: Settings, run_id: int) -> Path:
    """Checkpoints and records of one run, the same directory for every attempt."""
    return settings.home_dir.resolve() / "runs" / str(run_id)


def nonempty(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


def arm_gpus(spec: dict[str, Any]) -> int:
    """GPUs of one node the run's worker holds (its arm's `gpus`, or a command arm's `command.gpus`)."""
    return ArmSpec.model_validate(spec).gpu_count()


def choose_node(free: dict[str, int], need: int) -> str | None:
    """The node with the most free GPUs among those with at least `need`: an arm's GPUs are one node's."""
    fits = {node: n for node, n in free.items() if n >= need}
    return max(fits, key=lambda node: fits[node], default=None)


def worker_args(settings: Settings, run: Run, out_dir: Path, train_fn: str, code_archive: str | None) -> WorkerArgs:
    """What the node agent builds the run's worker from (worker/actor.py ArmWorker's arguments).
    `code_archive`: a command arm's code where the node holds it (runs/command_code.py ship_code)."""
    return WorkerArgs(
        run_id=run.id,
        spec=ArmSpec.model_validate(run.spec),
        out_dir=str(out_dir),
        lpips_weights=str(settings.lpips_weights.resolve()) if settings.lpips_weights else None,
        torch_threads=settings.worker_threads,
        train_fn=train_fn,
        storage=worker_storage(settings, run.checkpoint_url),
        data_store=worker_data_store(settings),
        code_archive=code_archive,
        compile_cache=worker_compile_cache(settings),
        end_evaluation=end_evaluation_of(run),  # a deciding grid's run: its evaluation too (runs/in_training.py)
    )


@dataclass
class Worker:
    """A live worker of ours (on `node`, through its agent) and what we have taken from it."""

    run_id: int
    name: str
    node: str
    after_step: int | None
    stop_sent: bool = False
    started: bool = False  # its first poll reply is committed (the run is `running`)
    info: dict[str, Any] = field(default_factory=dict)
    launched_at: float = field(default_factory=time.monotonic)  # time.monotonic() s, for start_timeout_s
    attempt: int = 0  # the run's retries when launched (the worker's upload log is per attempt)
    gpus: int = 1  # GPUs of its node it holds (arm_gpus)
    storage_seen: int = 0  # the newest upload-log entry of this worker stored as an event
    ingest_failures: int = 0  # consecutive replies that could not be stored (not counting DB outages)


def mark_running(session: Session, run: Run, info: dict[str, Any], node_name: str) -> None:
    """The worker's first reply: where the run landed (GPU, node) and what it runs (versions); starting -> running.

    `info` is what the node says (validated, lengths bounded); `node_name` is the node the controller
    started the worker on, the one name of it that copy-back and the dashboard rely on."""
    run.versions = info.get("provenance") or run.versions
    run.gpu_index = info.get("cuda_visible_devices")
    run.gpu_name = info.get("gpu_name") or run.gpu_name
    run.gpu_uuid = info.get("gpu_uuid")
    run.node = node_name  # the registered name; the hostname the node reports stays in the started event
    # Every node it ran on (a lost node's run resumes elsewhere), by the controller's name for it:
    # machines (namespaces of the test bed, cloned images) can share a hostname.
    if (run.nodes or [None])[-1] != node_name:
        run.nodes = [*(run.nodes or []), node_name]
    if run.state == RunState.starting:
        run.state = RunState.running
        said = {k: v for k, v in info.items() if k not in ("provenance", "node_name")}
        record_event(
            session,
            run,
            "started",
            f"on GPU {run.gpu_index} ({run.gpu_name or 'logical'}) of node {node_name} ({info.get('node')})",
            attempt=run.retries,
            **said,
            node_name=node_name,
        )
