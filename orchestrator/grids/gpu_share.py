"""How many GPUs a grid's arms may get: each node the controller knows of and its GPUs, an arm that asks
for more than any node has (a 422 naming the arm), and the GPU counts an arm's batch divides into.
`gpus_per_arm: auto` takes its counts from the night plan (grids/night.py).

An arm trains on the GPUs of one node (worker/ranks.py), so what matters is the largest node: the
joined and probed nodes' GPU lists (never past what the operator declared for each: a probe is the
node's word), the controller's own machine (its logical GPUs, else the GPUs its driver lists).
None known (no node probed yet, no GPU here): nothing is refused and auto means one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from model.spec import ArmSpec
from orchestrator.settings import Settings
from orchestrator.vocabulary import LOCAL_NODE, NodeState

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one entry per GPU of this machine, whatever is visible


def local_gpus(settings: Settings) -> int:
    """GPUs of the controller's own node: its logical GPUs where declared, else the driver's list."""
    if not settings.local_node:
        return 0
    if settings.logical_gpus:
        return settings.logical_gpus
    return len(list(NVIDIA_GPUS.iterdir())) if NVIDIA_GPUS.is_dir() else 0


def node_gpus(session: Session, settings: Settings) -> dict[str, int]:
    """Each node's GPUs: the local machine's, and each probed node's that may run arms, at the lower of its
    probe and the operator's declared count (a probe is the node's word); none: left out."""
    from orchestrator.db.models import Node

    usable = (NodeState.registered, NodeState.ready, NodeState.joined)
    counts = {LOCAL_NODE: local_gpus(settings)}
    for node in session.scalars(select(Node).where(Node.state.in_(usable))):
        counts[node.name] = node.usable_gpus
    return {name: n for name, n in counts.items() if n}


def largest_node_gpus(session: Session, settings: Settings) -> int | None:
    """The most GPUs one node may use (the local machine, the probed nodes that may run arms); None: unknown."""
    return max(node_gpus(session, settings).values(), default=0) or None


def sweep_nodes(session: Session, names: list[str]) -> dict[str, int]:
    """Each of a sweep's nodes with the GPUs it may use (its last probe, capped at what was declared)."""
    from orchestrator.db.models import Node

    nodes = session.scalars(select(Node).where(Node.name.in_(names)))
    return {node.name: node.usable_gpus for node in nodes if node.usable_gpus}


def sweep_node_gpus(session: Session, names: list[str]) -> int | None:
    """The most GPUs one of a sweep's nodes may use; None: unknown."""
    return max(sweep_nodes(session, names).values(), default=0) or None


def splits(spec: ArmSpec, gpus: int) -> bool:
    """The batch (and a fixed micro-batch) divides evenly over `gpus` ranks."""
    batch, micro = spec.schedule.batch_size, spec.schedule.fixed_micro_batch()
    return batch % gpus == 0 and (micro is None or (batch // gpus) % micro == 0)


def gpu_count_errors(
    arms: list[Any], overrides: dict[str, Any], resolved: list[tuple[str, ArmSpec]], node_gpus: int | None
) -> list[dict[str, Any]]:
    """An error per arm that asks for more GPUs than the largest node has: it could never be placed."""
    if not node_gpus:
        return []
    errors = []
    for i, (label, spec) in enumerate(resolved):
        if spec.gpu_count() <= node_gpus:
            continue
        if spec.command is not None:
            loc: tuple[Any, ...] = ("arms", i, "gpus")
        elif isinstance(arms[i], dict) and "gpus" in arms[i] or "gpus" not in overrides:
            loc = ("arms", i, "gpus")
        else:
            loc = ("overrides", "gpus")
        errors.append({
            "loc": list(loc),
            "msg": f"arm {label} asks for {spec.gpu_count()} GPUs but the largest node has {node_gpus}: "
            f"an arm trains on the GPUs of one node; ask for at most {node_gpus}",
            "type": "value_error",
        })
    return errors
