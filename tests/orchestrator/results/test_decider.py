"""The decision pass on a real database with real tiny arms trained on the CPU (no Ray: each wave's runs are
trained in this process and their records ingested, as the launcher would): max_seeds is never exceeded,
a wave's look is taken once however many passes ask, and an arm no open comparison needs gets no seed."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from model.spec import ArmSpec
from orchestrator.db.models import DecisionLook, Event, Grid, Run
from orchestrator.db.session import session_scope
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.results.decider import decide_due_grids
from orchestrator.results.decisions import look_comparisons
from orchestrator.runs.ingest import insert_metrics
from orchestrator.settings import Settings
from tests.kit.settings import tiny_overrides
from worker.train import train_arm

TINY = tiny_overrides(20)
TINY["eval"]["num_samples"] = TINY["data"]["held_out"] = 4  # every held-out image evaluated: images at budget


def train_queued(settings: Settings, grid_id: int, out: Path) -> list[tuple[str, int]]:
    """Train every queued run of the grid here and store its records, as a launcher would; returns
    (arm, seed) of the runs trained."""
    trained = []
    with session_scope(settings.database_url) as session:
        for run in session.scalars(select(Run).where(Run.grid_id == grid_id, Run.state == "queued")):
            where = out / f"run-{run.id}"
            records = list(train_arm(ArmSpec.model_validate(run.spec), where))
            insert_metrics(session, run.id, records)
            run.checkpoint_dir, run.last_checkpoint_step, run.state = str(where), records[-1]["step"], "completed"
            trained.append((run.arm, run.seed))
    return trained


def looks_of(settings: Settings, grid_id: int) -> list[DecisionLook]:
    with session_scope(settings.database_url) as session:
        looks = list(session.scalars(select(DecisionLook).where(DecisionLook.grid_id == grid_id)
                                     .order_by(DecisionLook.wave)))  # fmt: skip
        session.expunge_all()
        return looks


def test_an_open_comparison_takes_seeds_up_to_max_seeds_and_never_past(settings: Settings, tmp_path: Path) -> None:
    """A against A with its lr x1.01, at an alpha no tiny run can meet: the comparison stays open, so every
    look adds one seed of both arms until max_seeds; the last look calls it undecided and adds nothing."""
    decide = {"alpha": 1e-9, "min_seeds": 2, "max_seeds": 3}
    arms = ["A", {"parent": "A", "name": "A-lr", "schedule": {"lr": 3.03e-4}}]
    with session_scope(settings.database_url) as session:
        grid_id = create_grid(session, GridCreate(name="cap", arms=arms, overrides=TINY, decide=decide)).id
    waves = []
    for _ in range(5):  # more passes than the budget allows looks
        waves.append(sorted(train_queued(settings, grid_id, tmp_path)))
        decide_due_grids(settings)
        decide_due_grids(settings)  # a second pass over the same wave: a restarted controller's, say
    assert waves[:2] == [[("A", 0), ("A", 1), ("A-lr", 0), ("A-lr", 1)], [("A", 2), ("A-lr", 2)]]
    assert waves[2:] == [[], [], []]
    looks = looks_of(settings, grid_id)
    assert [(look.wave, look.final) for look in looks] == [(0, False), (1, True)]
    first, last = (look_comparisons(look) for look in looks)
    assert [(c.decision, c.action, c.k) for c in first] == [("open", "seed", 2)]
    assert [(c.decision, c.action, c.k, c.look) for c in last] == [("undecided", None, 3, 2)]
    assert 0 < first[0].alpha_spent < last[0].alpha_spent == pytest.approx(1e-9)  # all of it at the budget
    assert looks[0].actions[0]["arms"] == ["A", "A-lr"]
    with session_scope(settings.database_url) as session:
        grid = session.get(Grid, grid_id)
        assert grid is not None and grid.seeds == 3
        assert max(r.seed for r in grid.runs) == 2 and len(grid.runs) == 6
        kinds = [e.kind for e in session.scalars(select(Event).where(Event.grid_id == grid_id))]
    assert kinds.count("decide.look") == 2 and kinds.count("decide.action") == 1
