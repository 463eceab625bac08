"""GPUs per arm at submission, through the real API and database: an arm asking for more GPUs than the
largest node has is a 422 naming it, `gpus_per_arm: auto` takes each run's GPUs from the night plan that
the answer carries; and the launcher's choice of node for an arm of N GPUs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from orchestrator.app import create_app
from orchestrator.db.models import Node, Run
from orchestrator.db.session import session_scope
from orchestrator.runs.placement import choose_node
from orchestrator.settings import Settings
from orchestrator.vocabulary import NodeState

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# The arms at their own (seed) size: these grids are only planned, never trained here, and at seed size a
# run's training outweighs its fixed cost (start, compile, evaluations), which decides a tiny arm's plan.
SEED: dict[str, Any] = {}


@pytest.fixture
def quad(database_url: str, tmp_path: Path) -> Iterator[TestClient]:
    """The controller's own machine with 4 (logical) GPUs, the only node."""
    settings = Settings(database_url=database_url, home_dir=tmp_path, logical_gpus=4)
    with TestClient(create_app(settings, TOKEN)) as client:
        yield client


def submit(client: TestClient, body: dict[str, Any]) -> Any:
    return client.post("/api/grids", json={"name": "g", "overrides": SEED, **body}, headers=AUTH)


def gpus_of(database_url: str, grid_id: int) -> dict[str, int]:
    with session_scope(database_url) as session:
        runs = session.scalars(select(Run).where(Run.grid_id == grid_id).order_by(Run.position)).all()
        return {r.arm: r.spec.get("command", {}).get("gpus") if r.spec.get("command") else r.spec["gpus"] for r in runs}


def test_auto_spreads_a_quad_node_over_two_equal_arms(quad: TestClient, database_url: str) -> None:
    resp = submit(quad, {"arms": ["A", {"parent": "A", "name": "A2"}], "gpus_per_arm": "auto"})
    assert resp.status_code == 201, resp.text
    assert gpus_of(database_url, resp.json()["id"]) == {"A": 2, "A2": 2}
    # unequal arms (D routes a quarter of the tiny model's token work away): one after the other on all four
    resp = submit(quad, {"arms": ["A", "D"], "gpus_per_arm": "auto"})
    assert gpus_of(database_url, resp.json()["id"]) == {"A": 4, "D": 4}


def test_auto_shares_the_gpus_over_every_replicate(quad: TestClient, database_url: str) -> None:
    """One arm at two training seeds on four GPUs: both seeds run at once, two GPUs each."""
    resp = submit(quad, {"arms": ["A"], "gpus_per_arm": "auto", "seeds": 2})
    assert resp.status_code == 201, resp.text
    with session_scope(database_url) as session:
        runs = session.scalars(select(Run).where(Run.grid_id == resp.json()["id"]).order_by(Run.position)).all()
        assert [(r.seed, r.spec["gpus"]) for r in runs] == [(0, 2), (1, 2)]


def test_auto_takes_the_plans_counts_and_keeps_what_an_arm_names(quad: TestClient, database_url: str) -> None:
    resp = submit(quad, {"arms": ["A", "B", "C"], "gpus_per_arm": "auto"})
    assert resp.status_code == 201, resp.text
    plan = resp.json()["plan"]
    assert gpus_of(database_url, resp.json()["id"]) == {s["arm"]: s["gpus"] for s in plan["slots"]}
    # three arms on four GPUs: one GPU each would leave one idle the whole night; the plan uses all four
    assert plan["night_h"] < max(plan["hours"].values()) * 0.8
    assert plan["sources"] == {"A": "estimated", "B": "estimated", "C": "estimated"}
    assert plan["auto"] and plan["search"] == "exhaustive"
    assert quad.get(f"/api/grids/{resp.json()['id']}").json()["plan"] == plan  # the grid keeps it
    # one arm, batch 6: four GPUs do not split it evenly, two do; an arm naming its gpus keeps them
    six = {"parent": "A", "name": "six", "schedule": {"batch_size": 6}}
    resp = submit(quad, {"arms": [six], "gpus_per_arm": "auto"})
    assert gpus_of(database_url, resp.json()["id"]) == {"six": 2}
    resp = submit(quad, {"arms": [{"parent": "A", "name": "one", "gpus": 1}, "D"], "gpus_per_arm": "auto"})
    assert gpus_of(database_url, resp.json()["id"]) == {"one": 1, "D": 2}
    # without auto every arm keeps one GPU, and the plan says so
    resp = submit(quad, {"arms": ["A", "D"]})
    assert gpus_of(database_url, resp.json()["id"]) == {"A": 1, "D": 1}
    assert {s["gpus"] for s in resp.json()["plan"]["slots"]} == {1}


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"arms": ["A"], "overrides": {**SEED, "gpus": 8}}, ["overrides", "gpus"]),
        ({"arms": ["A", {"parent": "A", "name": "big", "gpus": 8}]}, ["arms", 1, "gpus"]),
    ],
)
def test_an_arm_asking_for_more_gpus_than_any_node_has_is_a_422_naming_it(
    quad: TestClient, body: dict[str, Any], loc: list[Any]
) -> None:
    resp = submit(quad, body)
    assert resp.status_code == 422, resp.text
    (error,) = resp.json()["detail"]
    assert error["loc"][-len(loc):] == loc
    assert "asks for 8 GPUs but the largest node has 4" in error["msg"]
    assert ("arm big" if "big" in str(body) else "arm A") in error["msg"]


def test_a_batch_that_does_not_split_over_the_gpus_is_a_422(quad: TestClient) -> None:
    resp = submit(quad, {"arms": [{"parent": "A", "name": "odd", "gpus": 3}]})
    assert resp.status_code == 422
    assert "must be divisible by gpus (3)" in resp.text


def test_a_probed_node_with_more_gpus_counts(quad: TestClient, database_url: str) -> None:
    with session_scope(database_url) as session:
        session.add(Node(name="octo", host="10.0.0.8", user="u", key_path="/k", state=NodeState.joined, declared_gpus=8,
                         gpus=[{"index": i} for i in range(8)]))
    resp = submit(quad, {"arms": ["A"], "overrides": {**SEED, "gpus": 8}})
    assert resp.status_code == 201, resp.text


def test_choose_node_needs_all_of_an_arms_gpus_on_one_node() -> None:
    free = {"local": 1, "a": 2, "b": 3}
    assert choose_node(free, 1) == "b"  # the most free, as before
    assert choose_node(free, 2) == "b"
    assert choose_node({"local": 1, "a": 2}, 2) == "a"
    assert choose_node({"local": 1, "a": 1}, 2) is None  # two free GPUs, but never on one node


def test_a_node_s_probe_never_counts_past_the_gpus_the_operator_declared(quad: TestClient, database_url: str) -> None:
    """A joined node whose nvidia-smi lists 64 GPUs, declared with 8: `auto` plans over its 8, never 64 (an
    arm of 16 or more, fitting only on the liar)."""
    with session_scope(database_url) as session:
        session.add(Node(name="liar", host="10.0.0.9", user="u", key_path="/k", state=NodeState.joined,
                         gpus=[{"index": i} for i in range(64)], declared_gpus=8))
    overrides = {**SEED, "schedule": {"batch_size": 64}}
    resp = submit(quad, {"arms": ["A", "B", "C", "D"], "gpus_per_arm": "auto", "overrides": overrides})
    assert resp.status_code == 201, resp.text
    gpus = gpus_of(database_url, resp.json()["id"])
    assert max(gpus.values()) == 8 and set(gpus) == {"A", "B", "C", "D"}  # 64 would plan an arm past 8


def test_registering_a_node_without_its_gpu_count_is_a_422_naming_the_field(quad: TestClient) -> None:
    body = {"name": "undeclared", "host": "10.0.0.10", "user": "u", "key_path": "/k"}
    resp = quad.post("/api/nodes", json=body, headers=AUTH)
    assert resp.status_code == 422, resp.text
    assert any(e["loc"][-1] == "gpus" for e in resp.json()["detail"]), resp.text
