"""A comparison borrows the seed variance of its paired difference where the earlier grid ran both arms at
matched seeds (issue 62): seed s of every arm shares its initialisation and data order, so the arms' seed
effects are correlated and cancel in the difference. On a real database with real tiny arms trained on the
CPU (as test_decider.py): an earlier fixed grid of A and C on 3 seeds, then a deciding grid of the same arms
on 3 seeds that borrows from it, as on the GPU in issue 62 (the fixed grid stood as the earlier study). What
it borrows must read the spread of its own per-seed differences (within 2x), where the two arms' spreads
summed (the rule for seeds that were not matched) read about 100x it here: C - A differs by 5e-5-1e-4 a
seed at 10 steps, while the seeds move both arms by 4e-3.

The CPU trainer is deterministic, so the later grid's seeds reproduce the earlier runs and the two paired
SDs agree exactly. At disjoint seeds they would be two estimates on 2 df each: measured on 8 seeds of these
arms, only 48% of the 560 ways to split them into two disjoint triples put the SDs within 2x of each other,
so such a test would pass by luck."""

from __future__ import annotations

import math
import statistics

import pytest
from sqlalchemy import select

from model.flow_headline import HEADLINE
from orchestrator.db.models import Grid, Metric
from orchestrator.db.session import session_scope
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.results.deciding.borrowed import difference_of
from orchestrator.results.deciding.borrowing import earlier_spreads
from orchestrator.results.deciding.decider import decide_due_grids
from orchestrator.results.deciding.decisions import look_comparisons
from orchestrator.results.reports.stats import value_of
from orchestrator.settings import Settings
from tests.kit.settings import tiny_overrides
from tests.orchestrator.results.deciding.test_decider import looks_of, train_queued

SEEDS = 3
QUICK = tiny_overrides(10)
QUICK["eval"]["num_samples"] = QUICK["data"]["held_out"] = 4  # every held-out image evaluated: images at budget


def finals(session, grid: Grid) -> dict[str, dict[int, float]]:  # type: ignore[no-untyped-def]
    """Each arm's runs' final headline by seed index."""
    found: dict[str, dict[int, float]] = {}
    for run in grid.runs:
        last = session.scalars(select(Metric).where(Metric.run_id == run.id).order_by(Metric.step.desc())).first()
        found.setdefault(run.arm, {})[run.seed] = float(value_of(last, HEADLINE))  # type: ignore[arg-type]
    return found


@pytest.fixture(scope="module")
def paired(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("paired")
    with session_scope(settings.database_url) as session:
        earlier = create_grid(session, GridCreate(name="earlier", arms=["A", "C"], overrides=QUICK, seeds=SEEDS)).id
    train_queued(settings, earlier, out)
    decide = {"alpha": 1e-9, "futility": 0, "min_seeds": SEEDS, "max_seeds": SEEDS, "borrow_from": [earlier]}
    with session_scope(settings.database_url) as session:
        grid_id = create_grid(session, GridCreate(name="later", arms=["A", "C"], overrides=QUICK, decide=decide)).id
    train_queued(settings, grid_id, out)
    assert decide_due_grids(settings) == [grid_id]
    with session_scope(settings.database_url) as session:
        grid = session.get(Grid, grid_id)
        assert grid is not None
        spreads = earlier_spreads(session, grid, [HEADLINE])
        values = finals(session, grid)
    return {"earlier": earlier, "grid_id": grid_id, "spreads": spreads, "values": values}


def test_the_borrowed_sd_is_the_grids_own_paired_sd_within_2x_and_the_summed_one_is_not(paired: dict) -> None:
    values, spreads = paired["values"], paired["spreads"]
    assert sorted(values["A"]) == sorted(values["C"]) == list(range(SEEDS))
    own = statistics.stdev(values["C"][s] - values["A"][s] for s in range(SEEDS))
    borrowed = spreads.difference(HEADLINE, "C", "A")
    assert borrowed is not None and borrowed.paired and borrowed.df == SEEDS - 1
    assert borrowed.grids == (paired["earlier"],)
    assert 0.5 <= math.sqrt(borrowed.value) / own <= 2.0, (borrowed, own)
    summed = difference_of(spreads.arms[HEADLINE]["A"], spreads.arms[HEADLINE]["C"])
    assert summed is not None and not summed.paired
    assert math.sqrt(summed.value) / own > 2.0, (summed, own)


def test_the_look_says_it_read_the_paired_differences(settings: Settings, paired: dict) -> None:
    (look,) = looks_of(settings, paired["grid_id"])
    (c,) = look_comparisons(look)
    assert (c.arm, c.other_arm, c.k) == ("C", "A", SEEDS)
    assert "the earlier grids' (grid" in c.reason and "their paired differences at matched seeds" in c.reason, c.reason


def test_a_grid_whose_arms_do_not_share_seeds_borrows_the_summed_spreads(settings: Settings, paired: dict) -> None:
    """The same earlier grid read for a grid whose seed s of A and of C trained at other training seeds: their
    difference is not paired, so only the arms' own spreads summed stand for it."""
    with session_scope(settings.database_url) as session:
        grid = session.get(Grid, paired["grid_id"])
        assert grid is not None
        for run in grid.runs:
            if run.arm == "C":
                run.spec = {**run.spec, "data": {**run.spec["data"], "seed": run.spec["data"]["seed"] + 7}}
        spreads = earlier_spreads(session, grid, [HEADLINE])
        session.rollback()
    borrowed = spreads.difference(HEADLINE, "C", "A")
    assert borrowed is not None and not borrowed.paired
    assert borrowed == difference_of(spreads.arms[HEADLINE]["A"], spreads.arms[HEADLINE]["C"])
