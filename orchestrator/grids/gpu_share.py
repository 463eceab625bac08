"""How many GPUs a grid's arms get: the largest node the controller knows of, an arm that asks for more
than any node has (a 422 naming the arm), and `gpus_per_arm: auto`, which spreads a node's GPUs over
the grid's arms when GPUs outnumber arms (two arms on a quad node: two GPUs each).

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
from orchestrator.vocabulary import NodeState

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one entry per GPU of this machine, whatever is visible


def local_gpus(settings: Settings) -> int:
    """GPUs of the controller's own node: its logical GPUs where declared, else the driver's list."""
    if not settings.local_node:
        return 0
    if settings.logical_gpus:
        return settings.logical_gpus
    return len(list(NVIDIA_GPUS.iterdir())) if NVIDIA_GPUS.is_dir() else 0


def largest_node_gpus(session: Session, settings: Settings) -> int | None:
    """The most GPUs one node may use (the local machine; the probed nodes that may run arms, each at the
    lower of its probe and the operator's declared count); None: unknown."""
    from orchestrator.db.models import Node

    usable = (NodeState.registered, NodeState.ready, NodeState.joined)
    probed = [node.usable_gpus for node in session.scalars(select(Node).where(Node.state.in_(usable)))]
    largest = max([local_gpus(settings), *probed])
    return largest or None


def sweep_node_gpus(session: Session, names: list[str]) -> int | None:
    """The most GPUs one of a sweep's nodes may use (their last probe, capped at what was declared); None: unknown."""
    from orchestrator.db.models import Node

    counts = [node.usable_gpus for node in session.scalars(select(Node).where(Node.name.in_(names)))]
    return max(counts, default=0) or None


def spread_gpus(
    resolved: list[tuple[str, ArmSpec]], node_gpus: int | None, seeds: int = 1
) -> list[tuple[str, ArmSpec]]:
    """`gpus_per_arm: auto`: each built-in arm that does not name its gpus gets an equal share of the node's
    GPUs that the other arms (those naming theirs, command arms) leave, lowered until it divides the arm's
    batch (each GPU trains an equal part of it); at least one. With replicates every seed of an arm runs
    at once, so the share is over arms x seeds."""
    takers = [i for i, (_, spec) in enumerate(resolved) if spec.command is None and "gpus" not in spec.model_fields_set]
    if not node_gpus or not takers:
        return resolved
    named = sum(spec.gpu_count() for i, (_, spec) in enumerate(resolved) if i not in takers) * seeds
    share = max(1, (node_gpus - named) // (len(takers) * seeds))
    out = list(resolved)
    for i in takers:
        label, spec = out[i]
        gpus = share
        while gpus > 1 and not _splits(spec, gpus):
            gpus -= 1
        out[i] = (label, ArmSpec.model_validate({**spec.model_dump(mode="json"), "gpus": gpus}))
    return out


def _splits(spec: ArmSpec, gpus: int) -> bool:
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
