"""Who a run is compared with (seed s of its parent and of the control), and the effects whose two arms ran
different seeds read over every seed of both (the unpaired crossed interval), not over the paired seeds
alone: a deciding grid adds seeds to the control for one comparison, and the others must not drop them."""

from __future__ import annotations

from typing import Any

from orchestrator.db.models import Grid, Metric, Run
from orchestrator.results.reports.costs import RunCost
from orchestrator.results.reports.effects import effect_reading, noise_budget
from orchestrator.results.reports.model import Effect
from orchestrator.results.reports.stats import SeedEffect, across_arms, per_image, per_reference


class Pairing:
    """Who a run is compared with: seed s of its parent and of the control (one seed: the control, else
    the grid's first run, as before replicates)."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.runs = list(grid.runs)
        self.by_seed = {(r.arm, r.seed): r for r in self.runs}

    def control(self, seed: int) -> Run | None:
        found = self.by_seed.get((self.grid.control_arm or "", seed))
        if found is None and self.grid.seeds <= 1 and self.runs:
            return self.runs[0]
        return found

    def of_arm(self, arm: str) -> list[Run]:
        """Every run of `arm`, by seed."""
        return sorted((r for r in self.runs if r.arm == arm), key=lambda r: r.seed)

    def parent(self, run: Run) -> Run | None:
        name = (run.spec or {}).get("parent")
        return self.by_seed.get((name, run.seed)) if isinstance(name, str) else None

    def comparators(self, run: Run) -> list[tuple[str, Run]]:
        """(against, other run): the parent, then the control unless it is the parent or the run itself."""
        parent, control = self.parent(run), self.control(run.seed)
        out = [("parent", parent)] if parent is not None and parent.id != run.id else []
        if control is not None and control.id != run.id and (parent is None or control.id != parent.id):
            out.append(("control", control))
        return out  # type: ignore[return-value]


def _table(runs: list[Run], rows: dict[int, list], step_of: dict[int, int | None],
           metric: str) -> dict[int, list[float]]:  # fmt: skip
    """Each run's per-image values of `metric` at its step (step_of, by run id), by seed; runs without them
    left out."""
    out = {}
    for r in runs:
        row = next((m for m in rows.get(r.id, []) if m.step == step_of.get(r.id)), None)
        values = per_image(row, metric) if row is not None else None
        if values is not None:
            out[r.seed] = values
    return out


def _references(runs: list[Run], rows: dict[int, list], step_of: dict[int, int | None], metric: str,
                seeds: list[int]) -> list[list[float]] | None:  # fmt: skip
    """The per-reference values (an MMD) of the runs of `seeds` at their step, in that order; None unless every
    one has them."""
    by_seed = {r.seed: r for r in runs}
    out = []
    for seed in seeds:
        run = by_seed[seed]
        row = next((m for m in rows.get(run.id, []) if m.step == step_of.get(run.id)), None)
        values = per_reference(row, metric) if row is not None else None
        if values is None:
            return None
        out.append(values)
    return out


def _seeds_at(runs: list[Run], rows: dict[int, list], step_of: dict[int, int | None]) -> set[int]:
    """The seeds of `runs` with a row at their step (step_of, by run id)."""
    return {r.seed for r in runs if any(m.step == step_of.get(r.id) for m in rows.get(r.id, []))}


def unpaired_words(e: SeedEffect, arm: str, k_arm: int, other: str, k_other: int) -> str:
    """What an unpaired row's interval covers (effects.noise_words for a paired one)."""
    df = f"t on {e.df:.1f} df" if e.df is not None else "normal"
    return (f"training seeds ({arm} k={k_arm}, {other} k={k_other}: every seed, unpaired) and evaluation images "
            f"(n={e.n}), crossed; {df}")


def final_steps(runs: list[Run], metrics: dict[int, list[Metric]], evaluated: dict[int, Any]) -> dict[int, int | None]:
    """Each run's step compared "final": its evaluated checkpoint's where an evaluation measured it, else its last."""
    out: dict[int, int | None] = {}
    for r in runs:
        point = evaluated.get(r.id) or (metrics[r.id][-1] if metrics.get(r.id) else None)
        out[r.id] = point.step if point is not None else None
    return out


def every_seed(effects: list[Effect], pairing: Pairing, rows: dict[int, list], final_step: dict[int, int | None],
               costs: dict[tuple[str, int], RunCost]) -> list[Effect]:  # fmt: skip
    """The effects with each one whose two arms ran different seeds read over all of them: the arm's runs at
    their final step against every comparator run at the arm's final step (the effect's), by the unpaired
    crossed interval. Left paired where the seeds match or either arm has fewer than two seeds with
    per-image values of one length."""
    out = []
    for e in effects:
        mine, theirs = pairing.of_arm(e.arm), pairing.of_arm(e.other_arm)
        other_step = {r.id: e.step for r in theirs}
        seff = table_a = table_b = None
        # Cheaply first (the dashboard polls this): runs with a row at the step, then their per-image values.
        if e.arm != e.other_arm and _seeds_at(mine, rows, final_step) != _seeds_at(theirs, rows, other_step):
            table_a, table_b = _table(mine, rows, final_step, e.metric), _table(theirs, rows, other_step, e.metric)
            at_step = all(final_step.get(r.id) == e.step for r in mine if r.seed in table_a)  # else paired, by step
            if set(table_a) != set(table_b) and at_step:
                ref_a = _references(mine, rows, final_step, e.metric, list(table_a))
                ref_b = _references(theirs, rows, other_step, e.metric, list(table_b))
                refs = (ref_a, ref_b) if ref_a is not None and ref_b is not None else None
                seff = across_arms(list(table_a.values()), list(table_b.values()), refs)
        if seff is None or seff.components is None or table_a is None or table_b is None:
            out.append(e)
            continue
        sides = [costs[(arm, s)] for arm, table in ((e.arm, table_a), (e.other_arm, table_b)) for s in table
                 if (arm, s) in costs]  # fmt: skip
        out.append(e.model_copy(update=dict(
            diff=seff.diff, low=seff.low, high=seff.high, k=seff.k, se=seff.se, df=seff.df, n=seff.n,
            interval="crossed", reading=effect_reading(seff.k, seff.low, seff.high),
            noise=unpaired_words(seff, e.arm, len(table_a), e.other_arm, len(table_b)),
            budget=noise_budget(seff.components, seff.df, sides))))  # fmt: skip
    return out
