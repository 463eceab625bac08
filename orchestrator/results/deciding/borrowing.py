"""Each arm's seed variance from earlier grids of the same arm: the service side of results/deciding/borrowed.py (which
stays pure). A deciding grid's `decide.borrow_from` names the earlier grids; the decision pass
(results/deciding/decider.py) reads a comparison with its two arms' variances from here.

The same arm: a run of an earlier grid whose stored spec equals the arm's once the training seed is taken
out of both the same way (`arm_identity`: grids/replicates.py `replicate_spec` moves only data.seed, with
the held-out split pinned, of a built-in arm, and the ABLATE_SEED variable of a command arm). Its value:
the metric at the run's final checkpoint as the report reads it (the earlier grid's largest completed
evaluation where it has one, else the run's last record). Only runs that completed count.

Whose records: an earlier run's value is a node's word, and here it would set another grid's interval, where
no check at one seed can catch it (issue 57: earlier runs said to agree within 1e-9 made a null comparison
"worse" at its first look). So a value counts only where every node it came from is trusted (runs/trust.py:
the controller's own machine, or a node the operator marked `trusted`): each node the run trained on, and
the node of the evaluation job whose row stands for it. A run with no node on record never left the
controller (an imported grid). An arm whose runs in an earlier grid came from other nodes borrows nothing
from that grid, and the look's reason says which node (results/deciding/borrowed.py `refused`).

`decide.borrow_from: "auto"`: the earlier grids (created before this one, the newest AUTO_SCAN looked at,
the newest MAX_BORROW that match kept) whose completed runs match an arm on four things: its spec but for
the seed (`arm_identity`: the split and the evaluation set included), its code (orchestrator/version.py
`same_code` of the versions each run's worker reported; a dirty tree matches nothing), its data (the
prepared manifest's sha256 its records name; built-in data has none on either side) and the images its
value was measured on (as many of the same split's). Command arms are not matched: the files behind their
`code` may have changed between grids with nothing on record to tell. Named ids are read as named.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from model.spec import ArmSpec
from orchestrator.db.models import EvaluationResult, Grid, Metric, Run
from orchestrator.grids.deciding import AUTO, MAX_BORROW, decide_of
from orchestrator.grids.replicates import SEED_ENV
from orchestrator.numbers import is_finite
from orchestrator.results.deciding.borrowed import SeedVariance, difference_of, paired_spread, pooled_arms, run_spread
from orchestrator.results.evaluations import largest_evaluation
from orchestrator.results.reports.stats import value_of
from orchestrator.runs.trust import nodes_of, trusted_nodes
from orchestrator.version import same_code
from orchestrator.vocabulary import RunState

AUTO_SCAN = 200  # earlier grids "auto" looks through at a look, newest first (a look reads specs, not records)


@dataclass(frozen=True)
class RunValue:
    """One completed run's value of a metric at its final checkpoint, with where it came from."""

    run_id: int
    identity: str  # arm_identity of its spec
    value: float
    images: int | None  # the images it was measured on (its row's <metric>_n)
    code: str | None  # the code its worker ran, as a version text (code_of)
    data: str | None  # the prepared data's manifest sha256 its records name
    strangers: tuple[str, ...]  # the nodes it came from that are not trusted (none: it may be borrowed)
    trained: str | None = None  # its training seed (training_seed): runs of two arms with one pair up


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


def training_seed(spec: dict[str, Any]) -> str | None:
    """The seed a run trained with, as text: a built-in arm's data.seed (initialisation and data order), a
    command arm's ABLATE_SEED. Runs of two arms at one training seed share their seed's initialisation and
    data order: their difference is paired. None where the spec does not say."""
    command = spec.get("command")
    if isinstance(command, dict):
        env = command.get("env")
        seed = env.get(SEED_ENV) if isinstance(env, dict) else None
        return f"command {seed}" if seed is not None else None
    data = spec.get("data")
    seed = data.get("seed", 0) if isinstance(data, dict) else 0  # the spec's default
    return f"data {seed}" if isinstance(seed, int) else None


def code_of(run: Run) -> str | None:
    """The code a run's worker reported (its provenance on `versions`) as a version text `same_code` reads:
    the git commit of a clean tree, else the installed distribution's version; None where neither (or a
    tree with uncommitted changes: it may hold anything)."""
    reported = run.versions or {}
    git = reported.get("git") if isinstance(reported.get("git"), dict) else {}
    commit = git.get("commit")
    if isinstance(commit, str) and commit and git.get("dirty") is False:
        return f"source tree, commit {commit}"
    versions = reported.get("versions") if isinstance(reported.get("versions"), dict) else {}
    installed = versions.get("ablate-dit")
    return installed if isinstance(installed, str) and installed and commit is None else None


def run_values(session: Session, grid: Grid, metrics: Sequence[str], trusted: set[str]) -> dict[str, list[RunValue]]:
    """Per metric, the grid's completed runs' finite values at their final checkpoint (the largest completed
    evaluation's row where it has one, else the run's last record), one per distinct spec (two runs of one
    seed count once); the grid's records are read once for all metrics."""
    runs = [r for r in grid.runs if r.state == RunState.completed]
    last: dict[int, Metric] = {}
    rows = select(Metric).where(Metric.run_id.in_([r.id for r in runs])).order_by(Metric.run_id, Metric.step)
    for m in session.scalars(rows):
        last[m.run_id] = m
    _, evaluated = largest_evaluation(session, grid)
    values: dict[str, list[RunValue]] = {metric: [] for metric in metrics}
    for metric, found in values.items():
        seen: set[str] = set()
        for r in sorted(runs, key=lambda r: r.position):
            job: EvaluationResult | None = evaluated.get(r.id)
            record = job if job is not None else last.get(r.id)
            value = value_of(record, metric) if record is not None else None
            spec, identity = json.dumps(r.spec, sort_keys=True), arm_identity(r.spec)
            if not is_finite(value) or spec in seen or identity is None:
                continue
            seen.add(spec)
            sources = [*nodes_of(r), *([job.node] if job is not None and job.node else [])]
            images = value_of(record, f"{metric}_n")  # type: ignore[arg-type]
            manifest = (last[r.id].extra or {}).get("data_manifest_sha256") if r.id in last else None
            found.append(RunValue(
                run_id=r.id, identity=identity, value=float(value), images=int(images) if is_finite(images) else None,  # type: ignore[arg-type]
                code=code_of(r), data=manifest if isinstance(manifest, str) else None,
                strangers=tuple(n for n in dict.fromkeys(sources) if n not in trusted),
                trained=training_seed(r.spec)))  # fmt: skip
    return values


def grid_spread(grid_id: int, values: Sequence[RunValue]) -> SeedVariance | None:
    """One arm's seed variance in one earlier grid from its runs' `values`: the trusted ones' spread, named
    by the grid; refused where the runs from nodes not trusted leave fewer than two; None under two runs."""
    kept = [v.value for v in values if not v.strangers]
    spread = run_spread(kept)
    if spread is not None:
        return SeedVariance(spread.value, spread.df, (grid_id,))
    if len(values) < 2:
        return None
    return refused_by(grid_id, values)


def refused_by(grid_id: int, values: Sequence[RunValue]) -> SeedVariance | None:
    """A refusal naming the nodes not trusted that `values` came from; None where every one is trusted."""
    strangers = sorted({n for v in values if v.strangers for n in v.strangers})
    if not strangers:
        return None
    return SeedVariance(0.0, 0.0, (grid_id,), refused=(
        f"grid {grid_id}'s runs of this arm came from node {', '.join(strangers)}, not trusted: a node's "
        "word may not set another grid's seed variance (mark it with `ablate nodes set NAME --trusted`)"))  # fmt: skip


def matches(earlier: RunValue, mine: Sequence[RunValue]) -> bool:
    """`earlier` ran what the arm's runs `mine` run: the same code, data and images (its spec matched)."""
    return bool(mine) and all(
        earlier.code is not None and m.code is not None and same_code(earlier.code, m.code)
        and earlier.data == m.data and earlier.images == m.images for m in mine)  # fmt: skip


def auto_grids(session: Session, grid: Grid, mine: Sequence[RunValue]) -> list[int]:
    """The earlier grids with a completed run of one of the grid's built-in arms (`mine`: its runs' values)
    on the same code, newest first: the AUTO_SCAN newest looked at, the MAX_BORROW newest kept (matches()
    then checks each run's data and images against its records)."""
    built_in = {r.id for r in grid.runs if not r.spec.get("command")}  # a command arm's files may have changed
    codes = {(v.identity, v.code) for v in mine if v.code is not None and v.run_id in built_in}
    newest = select(Grid).where(Grid.id < grid.id).order_by(Grid.id.desc()).limit(AUTO_SCAN)
    earlier = session.scalars(newest.options(selectinload(Grid.runs)))  # one query for every grid's runs
    found = []
    for g in earlier:
        if any(r.state == RunState.completed and _ran(r, codes) for r in g.runs):
            found.append(g.id)
        if len(found) == MAX_BORROW:
            break
    return found


def _ran(run: Run, codes: set[tuple[str, str | None]]) -> bool:
    """The run is of one of `codes`' identities, on that code."""
    identity, code = arm_identity(run.spec), code_of(run)
    return code is not None and any(identity == i and same_code(code, c) for i, c in codes)  # type: ignore[arg-type]


def pair_spread(grid_id: int, a: Sequence[RunValue], b: Sequence[RunValue]) -> SeedVariance | None:
    """A difference's seed variance in one earlier grid from its two arms' runs at matched training seeds
    (`paired_spread`), the pairs with a run from a node not trusted left out, named by the grid; refused
    where those leave fewer than two of at least two pairs; None under two matched seeds."""
    ours, theirs = ({v.trained: v for v in values if v.trained is not None} for values in (a, b))
    matched = [s for s in ours if s in theirs]
    kept = [s for s in matched if not ours[s].strangers and not theirs[s].strangers]
    spread = paired_spread({s: ours[s].value for s in kept}, {s: theirs[s].value for s in kept})
    if spread is not None:
        return SeedVariance(spread.value, spread.df, (grid_id,), paired=True)
    if len(matched) < 2:
        return None
    return refused_by(grid_id, [v for s in matched for v in (ours[s], theirs[s])])


@dataclass(frozen=True)
class EarlierSpreads:
    """Per metric, what the earlier grids measured of the seeds of a grid's arms: each arm's own spread, and
    each pair of arms' paired difference where both ran at matched seeds. `matched`: the pairs of the grid's
    own arms whose seed s share a training seed (only their comparisons are paired)."""

    arms: dict[str, dict[str, SeedVariance]]
    pairs: dict[str, dict[tuple[str, str], SeedVariance]]
    matched: frozenset[tuple[str, str]]

    def difference(self, metric: str, arm: str, other: str) -> SeedVariance | None:
        """The comparison's borrowed seed variance: the earlier grids' paired differences where both its grids
        matched the two arms' seeds, else the arms' own spreads summed (difference_of); None where neither."""
        pair = _pair(arm, other)
        paired = self.pairs.get(metric, {}).get(pair)
        if paired is not None and pair in self.matched:
            return paired
        arms = self.arms.get(metric, {})
        return difference_of(arms.get(arm), arms.get(other))


def _pair(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


def matched_pairs(grid: Grid) -> frozenset[tuple[str, str]]:
    """The pairs of the grid's arms whose seed 0 runs trained at one training seed: every seed s then does."""
    first = {r.arm: training_seed(r.spec) for r in grid.runs if r.seed == 0}
    return frozenset(_pair(a, b) for a in first for b in first
                     if a != b and first[a] is not None and first[a] == first[b])  # fmt: skip


def earlier_spreads(session: Session, grid: Grid, metrics: Sequence[str]) -> EarlierSpreads:
    """Per metric, each arm of `grid` with its seed variance from the grids its decide.borrow_from names (or,
    "auto", finds): per earlier grid the spread of that arm's runs from trusted nodes (grid_spread), pooled
    over the grids (`pooled_arms`, naming them); and each pair of its arms with the spread of their paired
    differences in the grids that ran both at matched seeds (pair_spread), pooled the same way. Each earlier
    grid is read once for all `metrics`. An arm no earlier grid ran at least twice is absent; one whose runs
    came from nodes not trusted is refused."""
    decide = decide_of(grid)
    borrow = decide.borrow_from if decide is not None else []
    identities = {r.arm: arm_identity(r.spec) for r in grid.runs if r.seed == 0}  # every arm has a seed 0
    trusted = trusted_nodes(session)
    auto = borrow == AUTO
    mine = run_values(session, grid, metrics, trusted) if auto else {}
    grid_ids = auto_grids(session, grid, [v for values in mine.values() for v in values]) if auto else list(borrow)
    per_arm: dict[str, dict[str, list[SeedVariance]]] = {m: {arm: [] for arm in identities} for m in metrics}
    per_pair: dict[str, dict[tuple[str, str], list[SeedVariance]]] = {m: {} for m in metrics}
    for grid_id in grid_ids:
        earlier = session.get(Grid, grid_id)
        if earlier is None:  # deleted since the submit
            continue
        for metric, values in run_values(session, earlier, metrics, trusted).items():
            same_arm: dict[str, list[RunValue]] = {}
            for arm, identity in identities.items():
                if identity is None:
                    continue
                same = [v for v in values if v.identity == identity]
                if auto:
                    own = [v for v in mine[metric] if v.identity == identity]
                    same = [v for v in same if matches(v, own)]
                same_arm[arm] = same
                spread = grid_spread(grid_id, same)
                if spread is not None:
                    per_arm[metric][arm].append(spread)
            for a in same_arm:
                for b in same_arm:
                    paired = pair_spread(grid_id, same_arm[a], same_arm[b]) if a < b else None
                    if paired is not None:
                        per_pair[metric].setdefault((a, b), []).append(paired)
    arms = {m: {arm: pooled_arms(spreads) for arm, spreads in found.items()} for m, found in per_arm.items()}
    pairs = {m: {pair: pooled_arms(spreads) for pair, spreads in found.items()} for m, found in per_pair.items()}
    return EarlierSpreads(arms={m: {arm: v for arm, v in found.items() if v is not None} for m, found in arms.items()},
                          pairs={m: {p: v for p, v in found.items() if v is not None} for m, found in pairs.items()},
                          matched=matched_pairs(grid))  # fmt: skip


def own_runs(session: Session, grid: Grid, metrics: Sequence[str]) -> dict[str, dict[str, dict[int, float]]]:
    """Per metric, the grid's own completed runs' values (as run_values reads them: the largest completed
    evaluation's, else the last record) by arm and seed, for reading a comparison unpaired
    (results/deciding/unpaired.py). Trust is not asked: the grid's own effects rest on the same values."""
    by_id = {r.id: r for r in grid.runs}
    out: dict[str, dict[str, dict[int, float]]] = {}
    for metric, values in run_values(session, grid, metrics, set()).items():
        arms: dict[str, dict[int, float]] = {}
        for v in values:
            run = by_id[v.run_id]
            arms.setdefault(run.arm, {})[run.seed] = v.value
        out[metric] = arms
    return out

