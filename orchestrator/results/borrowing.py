"""Each arm's seed variance from earlier grids of the same arm: the service side of results/borrowed.py (which
stays pure). A deciding grid's `decide.borrow_from` names the earlier grids; the decision pass
(results/decider.py) reads a comparison with its two arms' variances from here.

The same arm: a run of an earlier grid whose stored spec equals the arm's once the training seed is taken
out of both the same way (`arm_identity`: grids/replicates.py `replicate_spec` moves only data.seed, with
the held-out split pinned, of a built-in arm, and the ABLATE_SEED variable of a command arm). Its value:
the metric at the run's final checkpoint as the report reads it (the earlier grid's largest completed
evaluation where it has one, else the run's last record). Only runs that completed count.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from model.spec import ArmSpec
from orchestrator.db.models import Grid, Metric
from orchestrator.grids.deciding import decide_of
from orchestrator.grids.replicates import SEED_ENV
from orchestrator.numbers import is_finite
from orchestrator.results.borrowed import SeedVariance, pooled_arms, run_spread
from orchestrator.results.evaluations import largest_evaluation
from orchestrator.results.reports.stats import value_of
from orchestrator.vocabulary import RunState


def arm_identity(spec: dict[str, Any]) -> str | None:
    """A run's stored spec without its training seed, as comparable text: replicates of one arm give the
    same text, whichever seed (and whichever grid, seeds: 1 or many). None for a spec this version no
    longer reads (an old grid's): it matches no arm, rather than failing every look."""
    try:
        arm = ArmSpec.model_validate(spec)
    except ValidationError:
        return None
    if arm.command is not None:
        env = {k: v for k, v in arm.command.env.items() if k != SEED_ENV}
        arm = arm.model_copy(update={"command": arm.command.model_copy(update={"env": env})})
    else:
        data = arm.data.model_copy(update={"seed": 0, "split_seed": arm.data.dataset_seed()})
        arm = arm.model_copy(update={"data": data})
    return json.dumps(arm.model_dump(mode="json"), sort_keys=True)


def final_values(session: Session, grid: Grid, metrics: Sequence[str]) -> dict[str, dict[str, list[float]]]:
    """Per metric and arm identity, the completed runs' finite values at their final checkpoint (one per
    distinct spec: two runs of one seed count once); the grid's records are read once for all metrics."""
    runs = [r for r in grid.runs if r.state == RunState.completed]
    last: dict[int, Metric] = {}
    rows = select(Metric).where(Metric.run_id.in_([r.id for r in runs])).order_by(Metric.run_id, Metric.step)
    for m in session.scalars(rows):
        last[m.run_id] = m
    _, evaluated = largest_evaluation(session, grid)
    values: dict[str, dict[str, list[float]]] = {metric: {} for metric in metrics}
    for metric, by_identity in values.items():
        seen: set[str] = set()
        for r in sorted(runs, key=lambda r: r.position):
            record = evaluated.get(r.id, last.get(r.id))
            value = value_of(record, metric) if record is not None else None
            spec, identity = json.dumps(r.spec, sort_keys=True), arm_identity(r.spec)
            if not is_finite(value) or spec in seen or identity is None:
                continue
            seen.add(spec)
            by_identity.setdefault(identity, []).append(float(value))  # type: ignore[arg-type]
    return values


def earlier_seed_variances(session: Session, grid: Grid, metrics: Sequence[str]) -> dict[str, dict[str, SeedVariance]]:
    """Per metric, each arm of `grid` with its seed variance from the grids its decide.borrow_from names:
    per earlier grid the spread of that arm's runs (results/borrowed.py `run_spread`), pooled over the
    grids (`pooled_arms`); each earlier grid is read once for all `metrics`. An arm no earlier grid ran at
    least twice is absent."""
    decide = decide_of(grid)
    borrow = decide.borrow_from if decide is not None else []
    identities = {r.arm: arm_identity(r.spec) for r in grid.runs if r.seed == 0}  # every arm has a seed 0
    per_arm: dict[str, dict[str, list[SeedVariance]]] = {m: {arm: [] for arm in identities} for m in metrics}
    for grid_id in borrow:
        earlier = session.get(Grid, grid_id)
        if earlier is None:  # deleted since the submit
            continue
        for metric, values in final_values(session, earlier, metrics).items():
            for arm, identity in identities.items():
                spread = run_spread(values.get(identity, [])) if identity is not None else None
                if spread is not None:
                    per_arm[metric][arm].append(spread)
    pooled = {m: {arm: pooled_arms(spreads) for arm, spreads in arms.items()} for m, arms in per_arm.items()}
    return {m: {arm: v for arm, v in arms.items() if v is not None} for m, arms in pooled.items()}
