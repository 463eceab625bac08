"""`decide.borrow_from: "auto"` on a real database through the controller's decision pass: a fixed grid of
A and A with its lr x30 at 3 seeds, then earlier grids that must not be borrowed from although their arms'
specs match (another code version, other prepared data, values on other images, a node no one trusts, a
tree with uncommitted changes), then a deciding grid with borrow_from "auto" whose first wave is real tiny
arms trained on the CPU (as test_borrowing_grid.py: so the records auto matches on are the trainer's own).
The earlier grids' records are hand-made in the trainer's form: each run's value is its images' values
plus a seed shift, the decoys' shifts 1,000x the fixed grid's, so a variance that took one in would show.
Its first look reads the comparison with the fixed grid's variance alone and names that grid. Also the body:
"auto" is accepted and stored, a misspelling is a 422 naming the field."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from model.flow_headline import FLOW_T_WEIGHTS, HEADLINE, headline_fields
from orchestrator.db.models import Grid, Node
from orchestrator.db.session import session_scope
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.results.deciding.borrowing import earlier_spreads
from orchestrator.results.deciding.decider import decide_due_grids
from orchestrator.results.deciding.decisions import look_comparisons
from orchestrator.runs.ingest import insert_metrics
from orchestrator.settings import Settings
from tests.kit.settings import AUTH
from tests.orchestrator.results.deciding.test_borrowing_grid import LR30
from tests.orchestrator.results.deciding.test_decider import TINY, looks_of, train_queued

CODE = {"versions": {"ablate-dit": "0.1.dev9+gabc1234"}, "git": {"commit": "abc1234def", "dirty": False}}
OTHER_CODE = {"versions": {"ablate-dit": "0.1.dev9+g9999999"}, "git": {"commit": "9999999aaa", "dirty": False}}
DIRTY = {**CODE, "git": {"commit": "abc1234def", "dirty": True}}  # uncommitted changes: any code at all
IMAGES = TINY["eval"]["num_samples"]  # what the tiny runs' records measure: the whole held-out split


def ran(settings: Settings, grid_id: int, versions: dict) -> None:
    """The code each run's worker reported (the launcher stores it when the worker starts)."""
    with session_scope(settings.database_url) as session:
        grid = session.get(Grid, grid_id)
        assert grid is not None
        for run in grid.runs:
            run.versions = versions


def earlier(settings: Settings, name: str, versions: dict, shift_sd: float, images: int = IMAGES,
            node: str | None = None, **extra: str) -> int:  # fmt: skip
    """An earlier grid of the same arms on 3 seeds whose runs' values are the images' plus a seed shift of
    SD `shift_sd`, in the trainer's record form, with `extra` in each record."""
    rng = np.random.default_rng(len(name))
    with session_scope(settings.database_url) as session:
        grid = create_grid(session, GridCreate(name=name, arms=["A", LR30], overrides=TINY, seeds=3))
        for run in grid.runs:
            values = rng.normal(1.0, 0.1, images) + rng.normal(0, shift_sd)
            rows = [[float(v)] * len(FLOW_T_WEIGHTS) for v in values]
            record = {"step": 20, "val_flow_loss_grid": rows, **headline_fields(rows), **extra}
            insert_metrics(session, run.id, [record])
            run.state, run.last_checkpoint_step, run.versions = "completed", 20, versions
            if node is not None:
                run.node, run.nodes = node, [node]
        return grid.id


@pytest.fixture(scope="module")
def auto(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("auto")
    with session_scope(settings.database_url) as session:
        session.add(Node(name="rented-2", host="127.0.0.1", user="u", key_path="/k"))
    fixed = earlier(settings, "fixed", CODE, 0.03)
    decoys = [earlier(settings, "other code", OTHER_CODE, 30.0),
              earlier(settings, "other data", CODE, 30.0, data_manifest_sha256="f" * 64),
              earlier(settings, "other images", CODE, 30.0, images=IMAGES * 2),
              earlier(settings, "a stranger's", CODE, 30.0, node="rented-2"),
              earlier(settings, "a dirty tree", DIRTY, 30.0)]  # fmt: skip
    decide = {"alpha": 1e-9, "futility": 0, "min_seeds": 1, "max_seeds": 2, "borrow_from": "auto"}
    with session_scope(settings.database_url) as session:
        grid_id = create_grid(session, GridCreate(name="auto", arms=["A", LR30], overrides=TINY, decide=decide)).id
    train_queued(settings, grid_id, out)
    ran(settings, grid_id, CODE)
    decide_due_grids(settings)
    return {"fixed": fixed, "decoys": decoys, "grid_id": grid_id}


def test_auto_borrows_from_the_grid_of_the_same_arms_code_data_and_images_only(settings: Settings,
                                                                               auto: dict) -> None:  # fmt: skip
    with session_scope(settings.database_url) as session:
        grid, fixed = session.get(Grid, auto["grid_id"]), session.get(Grid, auto["fixed"])
        assert grid is not None and fixed is not None
        found = earlier_spreads(session, grid, [HEADLINE]).arms[HEADLINE]
        named = fixed.decide = {"borrow_from": [auto["fixed"]]}  # the same grid named by id reads the same
        assert named
        by_id = earlier_spreads(session, fixed, [HEADLINE]).arms[HEADLINE]
        session.rollback()
    assert sorted(found) == ["A", "A-lr30"]
    for arm, v in found.items():
        assert (v.grids, v.df, v.refused) == ((auto["fixed"],), 2, None)  # 3 seeds, no decoy's
        assert v.value == pytest.approx(by_id[arm].value) and v.value < 1.0  # the decoys' spread ~900


def test_the_first_look_names_the_grid_it_borrowed_from(settings: Settings, auto: dict) -> None:
    (c,) = look_comparisons(looks_of(settings, auto["grid_id"])[0])
    assert (c.arm, c.k, c.look) == ("A-lr30", 1, 1)
    assert f"seed variance: one seed: the earlier grids' (grid {auto['fixed']}) on " in c.reason, c.reason
    assert c.decision == "open" and c.action == "seed"


def test_auto_with_no_earlier_grid_of_its_code_reads_its_own_seeds(settings: Settings, auto: dict) -> None:
    with session_scope(settings.database_url) as session:
        grid = session.get(Grid, auto["grid_id"])
        assert grid is not None
        for run in grid.runs:
            run.versions = {**CODE, "git": {"commit": "1111111bbb", "dirty": False}}
        none = earlier_spreads(session, grid, [HEADLINE])
        assert none.arms == {HEADLINE: {}} and none.pairs == {HEADLINE: {}}
        session.rollback()


def test_auto_is_accepted_and_stored_and_a_misspelling_names_the_field(client: TestClient) -> None:
    body = {"name": "auto", "arms": ["A", "C"], "decide": {"min_seeds": 1, "borrow_from": "auto"}}
    resp = client.post("/api/grids", json=body, headers=AUTH)
    assert resp.status_code == 201, resp.text
    with session_scope(client.app.state.settings.database_url) as session:  # type: ignore[attr-defined]
        grid = session.get(Grid, resp.json()["id"])
        assert grid is not None and grid.decide is not None and grid.decide["borrow_from"] == "auto"
    body["decide"]["borrow_from"] = "automatic"
    resp = client.post("/api/grids", json=body, headers=AUTH)
    assert resp.status_code == 422, resp.text
    (error,) = resp.json()["detail"]
    assert error["loc"] == ["body", "decide", "borrow_from"] and '"auto" or a list of earlier grid ids' in error["msg"]
