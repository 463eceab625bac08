"""Whose values may decide another node's arm.

A node's values are its word: the ranges bound them (runs/metric_ranges.py), but an in-range lie passes.
The stall rule compares an arm with the control arm, so the control's node could stop every other arm
by reporting a control better than it is. Values from a node may therefore stop an arm only where they
come from the arm's own node (which could lie about the arm anyway) or from a trusted node: the
controller's own machine, or a registered node the operator marked `trusted` (`ablate nodes add
--trusted`). Elsewhere the stall is a warning with its evidence, on the dashboard.

An evaluation job (runs/evaluation_jobs.py) measures a run's checkpoint again, and its values then stand
for the run's own in every comparison. The same rule holds it: a run's evaluation may run, and be
believed, only on a node the run ran on or a trusted one, and the control of a grid with
control_on_trusted only on a trusted one (`evaluator_refused`).
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Node, Run
from orchestrator.fleet.inventory import LOCAL


def trusted_nodes(session: Session) -> set[str]:
    """Names of the nodes whose values may stop any arm: the controller's own machine and those the
    operator marked trusted."""
    rows = {name: trusted for name, trusted in session.execute(select(Node.name, Node.trusted))}
    return {name for name, trusted in rows.items() if trusted} | ({LOCAL} if LOCAL not in rows else set())


def nodes_of(run: Run) -> list[str]:
    """Every node the run ran on, in order (its series came from them)."""
    return list(dict.fromkeys(run.nodes or ([run.node] if run.node else [])))


def strangers(nodes: Iterable[str], own: Iterable[str], trusted: set[str]) -> list[str]:
    """The nodes among `nodes` that are neither `own` nor trusted, in order."""
    mine = set(own)
    return [n for n in dict.fromkeys(nodes) if n not in mine and n not in trusted]


def untrusted_control(session: Session, run: Run, control: Run) -> str | None:
    """Why the control's values may not stop `run`, or None when every node the control ran on is the
    run's own or trusted."""
    foreign = strangers(nodes_of(control), nodes_of(run), trusted_nodes(session))
    if not foreign:
        return None
    return (
        f"the control's values come from node {', '.join(foreign)}, not this arm's node and not trusted "
        f"(mark it with `ablate nodes set NAME --trusted`, or give the grid control_on_trusted)"
    )


def trusted_only(session: Session, run: Run, free: dict[str, int]) -> dict[str, int]:
    """The free GPUs per node that `run` may be placed on: only the trusted nodes' for the control arm of
    a grid with control_on_trusted (it waits for one), every node's otherwise."""
    grid = run.grid
    if not grid.control_on_trusted or run.arm != grid.control_arm:
        return free
    trusted = trusted_nodes(session)
    return {node: gpus for node, gpus in free.items() if node in trusted}


def evaluator_refused(run: Run, node: str | None, trusted: set[str]) -> str | None:
    """Why an evaluation of `run` on `node` may not stand for the run's values, or None when it may: the
    node is one the run ran on or a trusted one, and a trusted one for the control of a grid with
    control_on_trusted. `trusted`: trusted_nodes()."""
    if node is None:
        return "no node on record for the job"
    if node in trusted:
        return None
    grid = run.grid
    if grid.control_on_trusted and run.arm == grid.control_arm:
        return f"node {node} is not trusted, and the grid keeps its control on trusted nodes (control_on_trusted)"
    own = nodes_of(run)
    if node in own:
        return None
    ran_on = f"the run's nodes: {', '.join(own)}" if own else "the run has no node on record"
    return (f"node {node} never ran this run ({ran_on}) and is not trusted "
            f"(mark it with `ablate nodes set {node} --trusted`)")


def evaluation_nodes(run: Run, free: dict[str, int], trusted: set[str]) -> dict[str, int]:
    """The free GPUs per node that an evaluation of `run` may be placed on (evaluator_refused): a job with
    none waits for one. `trusted`: trusted_nodes()."""
    return {node: gpus for node, gpus in free.items() if evaluator_refused(run, node, trusted) is None}
