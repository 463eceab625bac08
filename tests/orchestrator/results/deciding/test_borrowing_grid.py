"""A deciding grid that borrows its arms' seed variance from an earlier grid (decide.borrow_from), on a real
database with real tiny arms trained on the CPU (as test_decider.py: each wave's runs trained in this
process and their records stored, as the launcher would; the decision pass is the controller's own).

First a fixed grid of A and A with its lr x30 at 3 seeds; then a deciding grid of the same arms with
min_seeds 1 that borrows from it, at an alpha no tiny run can meet and futility off, so it stays open and
takes a seed a look up to max_seeds. Its first look reads the comparison on one seed with the earlier
grid's variance (without borrowing, one seed has no interval across seeds to judge: "no interval across
seeds to judge"), its second pools its own two seeds' with it (or, where its own disagree, reads them
alone), and it never queues past max_seeds.

On this machine's tiny runs the earlier grid's seed variances were 5e-6 (A) and 1.3e-3 (lr x30) against a
difference of -0.75 whose four images' spread dominates: at the default alpha the first look closes it
undecided (futile: more seeds cannot narrow what the images hold), which is why this grid asks the
impossible."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from sqlalchemy import select

from model.command_spec import CommandSpec
from model.flow_headline import HEADLINE
from model.spec import ArmSpec
from orchestrator.db.models import Grid, Metric
from orchestrator.db.session import session_scope
from orchestrator.grids.replicates import replicate_spec
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.results.deciding.borrowing import arm_identity, earlier_spreads
from orchestrator.results.deciding.decider import decide_due_grids
from orchestrator.results.deciding.decisions import look_comparisons
from orchestrator.results.reports.stats import value_of
from orchestrator.settings import Settings
from tests.orchestrator.results.deciding.test_decider import TINY, looks_of, train_queued
from tests.orchestrator.test_cli import ablate

LR30 = {"parent": "A", "name": "A-lr30", "schedule": {"lr": 9e-3}}  # A's lr 3e-4 x 30
MAX_SEEDS = 3


def identity(spec: ArmSpec) -> str | None:
    return arm_identity(spec.model_dump(mode="json"))


def test_replicates_of_one_arm_share_an_identity_and_other_arms_do_not() -> None:
    arm = ArmSpec.model_validate({"data": {"seed": 7}})
    assert identity(replicate_spec(arm, 2)) == identity(arm) == identity(replicate_spec(arm, 0))
    assert identity(arm.model_copy(update={"data": arm.data.model_copy(update={"split_seed": 3})})) != identity(arm)
    assert identity(arm.model_copy(update={"schedule": arm.schedule.model_copy(update={"lr": 1e-3})})) != identity(arm)
    mine = ArmSpec(command=CommandSpec(code="/code", argv=["python", "train.py"], env={"LR": "1"}))
    assert identity(replicate_spec(mine, 3)) == identity(mine)
    other = ArmSpec(command=CommandSpec(code="/code", argv=["python", "train.py"], env={"LR": "2"}))
    assert identity(other) != identity(mine)
    # A stored spec this version no longer reads matches nothing (and fails no look).
    assert arm_identity({"model": {"size": "colossal"}}) is None


@pytest.fixture(scope="module")
def borrowing(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("borrowing")
    with session_scope(settings.database_url) as session:
        earlier = create_grid(session, GridCreate(name="earlier", arms=["A", LR30], overrides=TINY, seeds=3)).id
    train_queued(settings, earlier, out)
    decide = {"alpha": 1e-9, "futility": 0, "min_seeds": 1, "max_seeds": MAX_SEEDS, "borrow_from": [earlier]}
    with session_scope(settings.database_url) as session:
        grid_id = create_grid(session, GridCreate(name="borrows", arms=["A", LR30], overrides=TINY, decide=decide)).id
    waves = []
    for _ in range(MAX_SEEDS + 2):  # more waves than the budget allows
        waves.append(sorted(train_queued(settings, grid_id, out)))
        decide_due_grids(settings)
    return {"earlier": earlier, "grid_id": grid_id, "waves": waves}


def test_each_arm_borrows_the_spread_of_its_own_earlier_runs(settings: Settings, borrowing: dict) -> None:
    with session_scope(settings.database_url) as session:
        grid, earlier = session.get(Grid, borrowing["grid_id"]), session.get(Grid, borrowing["earlier"])
        assert grid is not None and earlier is not None
        found = earlier_spreads(session, grid, [HEADLINE]).arms[HEADLINE]
        finals: dict[str, list[float]] = {}
        for run in earlier.runs:
            last = session.scalars(select(Metric).where(Metric.run_id == run.id).order_by(Metric.step.desc())).first()
            finals.setdefault(run.arm, []).append(value_of(last, HEADLINE))  # type: ignore[arg-type]
        # A grid of one same arm and one other (lr x30.3): the other borrows nothing.
        other = {"parent": "A", "name": "A-lr30", "schedule": {"lr": 9.1e-3}}
        decide = {"min_seeds": 1, "borrow_from": [earlier.id]}
        unlike = create_grid(session, GridCreate(name="unlike", arms=["A", other], overrides=TINY, decide=decide))
        partial = earlier_spreads(session, unlike, [HEADLINE]).arms[HEADLINE]
    assert sorted(found) == ["A", "A-lr30"]
    for arm, v in found.items():
        assert v.df == 2 and v.value == pytest.approx(statistics.variance(finals[arm]))  # 3 seeds: 2 df
    assert sorted(partial) == ["A"] and partial["A"] == found["A"]


def test_the_first_look_reads_one_seed_on_the_borrowed_variance(settings: Settings, borrowing: dict) -> None:
    first = looks_of(settings, borrowing["grid_id"])[0]
    (c,) = look_comparisons(first)
    assert (c.arm, c.other_arm, c.k, c.n, c.look) == ("A-lr30", "A", 1, 4, 1)
    assert "seed variance: one seed: the earlier grids'" in c.reason, c.reason
    assert c.low is not None and c.high is not None and c.low < c.diff < c.high  # an interval on one seed
    # 0 allowed: at a planned fraction of 1 seed in 3, O'Brien-Fleming spends under a float's reach of alpha 1e-9
    assert c.decision == "open" and c.action == "seed" and 0 <= c.alpha_spent <= 1e-9


def test_status_says_what_the_seed_variance_rested_on(settings: Settings, borrowing: dict, tmp_path: Path) -> None:
    env = {"ABLATE_DATABASE_URL": settings.database_url, "ABLATE_HOME_DIR": str(tmp_path)}
    proc = ablate("status", str(borrowing["grid_id"]), env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (row,) = [line for line in proc.stdout.splitlines() if "A-lr30 vs A (parent)" in line]
    assert "undecided" in row and "seed variance: " in row and "earlier grids'" in row, proc.stdout


def test_a_borrowing_grid_takes_seeds_while_open_and_never_passes_max_seeds(settings: Settings,
                                                                             borrowing: dict) -> None:  # fmt: skip
    waves, taken = borrowing["waves"], looks_of(settings, borrowing["grid_id"])
    assert waves == [[("A", s), ("A-lr30", s)] for s in range(MAX_SEEDS)] + [[], []]
    assert [look.wave for look in taken] == [0, 1, 2] and taken[-1].final and taken[-1].actions == []
    comparisons = [look_comparisons(look)[0] for look in taken]
    assert [(c.k, c.decision) for c in comparisons] == [(1, "open"), (2, "open"), (3, "undecided")]
    # From two seeds on, the comparison's own seeds are read with the earlier grid's (pooled on the summed
    # df, or alone where they spread past the check's bound).
    for c in comparisons[1:]:
        assert "seed variance: pooled with the earlier grids'" in c.reason or "its own seeds only" in c.reason, c
    with session_scope(settings.database_url) as session:
        grid = session.get(Grid, borrowing["grid_id"])
        assert grid is not None and max(r.seed for r in grid.runs) == MAX_SEEDS - 1 and len(grid.runs) == 6
