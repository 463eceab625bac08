"""The decision pass on a real database with real tiny arms trained on the CPU (no Ray: each wave's runs are
trained in this process and their records ingested, as the launcher would): max_seeds is never exceeded,
a wave's look is taken once however many passes ask; and each decision is shown in the report, the
dashboard and `ablate status`."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from model.spec import ArmSpec
from orchestrator.dashboard.data import grid_detail
from orchestrator.db.models import DecisionLook, Evaluation, EvaluationResult, Event, Grid, Run
from orchestrator.db.session import session_scope
from orchestrator.fleet.inventory import LOCAL
from orchestrator.grids.deciding import DecideSpec, add_seed
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.results.deciding.decider import decide_due_grids, due_looks, queue_actions
from orchestrator.results.deciding.decisions import ComparisonLook, look_comparisons
from orchestrator.results.evaluations import largest_evaluation
from orchestrator.results.reports.build import build_report
from orchestrator.results.reports.render import RENDERERS
from orchestrator.runs.ingest import insert_metrics
from orchestrator.settings import Settings
from tests.kit.settings import tiny_overrides
from tests.orchestrator.test_cli import ablate
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


@pytest.fixture(scope="module")
def capped(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A against A with its lr x1.01, at an alpha no tiny run can meet and futility off: the comparison stays
    open, so each look adds one seed of both arms until max_seeds (3). Each wave is trained here, then the
    decision pass runs twice (a second pass over the same wave: a restarted controller's, say); five waves
    are offered, more than the budget allows. What the dashboard said after the first look is kept."""
    out = tmp_path_factory.mktemp("capped")
    decide = {"alpha": 1e-9, "min_seeds": 2, "max_seeds": 3, "futility": 0}  # no early undecided
    arms = ["A", {"parent": "A", "name": "A-lr", "schedule": {"lr": 3.03e-4}}]
    with session_scope(settings.database_url) as session:
        grid_id = create_grid(session, GridCreate(name="cap", arms=arms, overrides=TINY, decide=decide)).id
    waves, after_first = [], None
    for _ in range(5):
        waves.append(sorted(train_queued(settings, grid_id, out)))
        decide_due_grids(settings)
        decide_due_grids(settings)
        if after_first is None:
            with session_scope(settings.database_url) as session:
                after_first = grid_detail(session, session.get(Grid, grid_id))["decide"]
    return {"grid_id": grid_id, "waves": waves, "after_first": after_first}


def test_an_open_comparison_takes_seeds_up_to_max_seeds_and_never_past(settings: Settings, capped: dict) -> None:
    grid_id, waves = capped["grid_id"], capped["waves"]
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


def test_the_decision_is_shown_in_the_report_the_dashboard_and_status(settings: Settings, capped: dict,
                                                                       tmp_path: Path) -> None:  # fmt: skip
    grid_id = capped["grid_id"]
    opened = capped["after_first"]  # the dashboard's panel while the comparison was open
    assert (opened["looks"], opened["final"], opened["open"]) == (1, False, [
        {"comparison": "A-lr vs A (parent) on val_flow_ivw", "look": 1, "running": "one more seed of A-lr and A"}])
    with session_scope(settings.database_url) as session:
        grid = session.get(Grid, grid_id)
        report = build_report(session, grid)
        detail = grid_detail(session, grid)
    (decided,) = [e for e in report.effects if e.decision is not None]
    assert (decided.arm, decided.metric, decided.decision, decided.look, decided.k, decided.n) == (
        "A-lr", "val_flow_ivw", "undecided", 2, 3, 4)
    assert decided.alpha_spent == pytest.approx(1e-9)
    assert all(e.decision is None for e in report.effects if e.metric != "val_flow_ivw")
    markdown = RENDERERS["md"](report)
    assert "| decision |" in markdown and "undecided (look 2, alpha spent 1 × 10⁻⁹, k=3, n=4" in markdown
    assert "undecided (look 2" in RENDERERS["html"](report)
    assert [e["decision"] for e in detail["effects"] if e["metric"] == "val_flow_ivw"] == ["undecided"]
    assert (detail["decide"]["final"], detail["decide"]["open"], detail["decide"]["undecided"]) == (True, [], 1)
    env = {"ABLATE_DATABASE_URL": settings.database_url, "ABLATE_HOME_DIR": str(tmp_path)}
    proc = ablate("status", str(grid_id), env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "decides at alpha 1e-09 per comparison: 2 look(s), decision ended" in proc.stdout
    (row,) = [line for line in proc.stdout.splitlines() if "A-lr vs A (parent)" in line]
    assert [c.strip() for c in row.split("│")[1:-1]][2:6] == ["undecided", "2", "1 × 10⁻⁹", "3"]


def test_an_arm_no_open_comparison_needs_gets_no_seed(settings: Settings) -> None:
    """Three arms, two comparisons against A: lr x30's decided, lr x1.01's open and asking for a seed. The
    seed goes to lr x1.01 and A only; an open comparison whose arms are at max_seeds gets none."""
    arms = ["A", {"parent": "A", "name": "A-lr30", "schedule": {"lr": 9e-3}},
            {"parent": "A", "name": "A-lr", "schedule": {"lr": 3.03e-4}}]  # fmt: skip
    common = dict(against="parent", other_arm="A", metric="val_flow_ivw", diff=-0.1, low=-0.2, high=0.1, k=2, n=4,
                  look=1, alpha_spent=0.001)  # fmt: skip
    decided = ComparisonLook(arm="A-lr30", decision="better", **common)  # type: ignore[arg-type]
    still_open = ComparisonLook(arm="A-lr", decision="open", action="seed", **common)  # type: ignore[arg-type]
    with session_scope(settings.database_url) as session:
        grid = create_grid(session, GridCreate(name="some", arms=arms, overrides=TINY, decide={"max_seeds": 3}))
        spec = DecideSpec.model_validate(grid.decide)
        (action,), _ = queue_actions(session, grid, [decided, still_open], spec, max_images=4, images=None)
        assert action["action"] == "seed" and action["arms"] == ["A", "A-lr"]
        assert sorted((r.arm, r.seed) for r in grid.runs if r.seed == 2) == [("A", 2), ("A-lr", 2)]
        assert queue_actions(session, grid, [decided, still_open], spec, max_images=4, images=None) == ([], None)
        assert max(r.seed for r in grid.runs) == 2


def test_only_deciding_grids_are_looked_at(settings: Settings) -> None:
    """A grid with fixed seeds whose runs have all ended is not the decision pass's (its `decide` is SQL
    NULL, not JSON null); a deciding one whose wave has ended is."""
    with session_scope(settings.database_url) as session:
        plain = create_grid(session, GridCreate(name="plain", arms=["A", "B"], overrides=TINY))
        deciding = create_grid(session, GridCreate(name="deciding", arms=["A", "B"], overrides=TINY, decide={}))
        for run in [*plain.runs, *deciding.runs]:
            run.state = "completed"
        session.flush()
        assert deciding.id in due_looks(session) and plain.id not in due_looks(session)


def test_seeds_added_after_an_evaluation_are_scored_on_its_images_before_the_look(settings: Settings) -> None:
    """The effects use the grid's largest evaluation; a seed added after it was not in it. Before the next
    look the new seed's runs alone are evaluated on those images (issue 62: the catch-up scored all 8 runs
    where 2 were new), once: a catch-up that failed is not asked again. One that completed stands beside the
    first, and the look reads every run on those images."""
    arms = ["A", {"parent": "A", "name": "A-lr", "schedule": {"lr": 3.03e-4}}]
    with session_scope(settings.database_url) as session:
        grid = create_grid(session, GridCreate(name="catch-up", arms=arms, overrides=TINY, decide={}))
        for run in grid.runs:
            run.state, run.last_checkpoint_step = "completed", 20
        done = Evaluation(grid_id=grid.id, images=4, step="final", state="completed")
        session.add(done)
        session.flush()
        session.add_all([EvaluationResult(evaluation_id=done.id, run_id=r.id, step=20, state="completed", extra={},
                                          node=LOCAL)  # the controller's own machine: believed for any run
                         for r in grid.runs])  # fmt: skip
        for run in add_seed(grid, ["A", "A-lr"]):
            run.state, run.last_checkpoint_step = "completed", 20
        grid_id, done_id = grid.id, done.id
    assert grid_id not in decide_due_grids(settings)  # no look: the catch-up first
    with session_scope(settings.database_url) as session:
        (catch,) = session.scalars(select(Evaluation).where(Evaluation.grid_id == grid_id, Evaluation.id != done_id))
        assert catch.images == 4 and sorted((r.run.arm, r.run.seed) for r in catch.results) == [("A", 2), ("A-lr", 2)]
        kinds = [e.kind for e in session.scalars(select(Event).where(Event.grid_id == grid_id))]
        assert kinds.count("decide.catch_up") == 1 and "decide.look" not in kinds
        catch.state = "failed"
        for row in catch.results:
            row.state = "failed"
    assert grid_id in decide_due_grids(settings)  # every run was asked: the look is taken as things are
    assert [look.wave for look in looks_of(settings, grid_id)] == [0]
    with session_scope(settings.database_url) as session:  # had it completed, it would stand beside the first
        grid = session.get(Grid, grid_id)
        catch = session.get(Evaluation, catch.id)
        assert grid is not None and catch is not None
        catch.state = "completed"
        for row in catch.results:
            row.state, row.node = "completed", LOCAL
        used, rows = largest_evaluation(session, grid)
        assert used is not None and used.id == catch.id and used.images == 4
        assert sorted((row.evaluation_id, row.run.seed) for row in rows.values()) == sorted(
            [(done_id, 0), (done_id, 0), (done_id, 1), (done_id, 1), (catch.id, 2), (catch.id, 2)])  # fmt: skip
        session.rollback()
