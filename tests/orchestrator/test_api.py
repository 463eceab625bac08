"""The REST API against a real migrated database (Postgres in CI, SQLite otherwise)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.app import create_app
from orchestrator.db.models import Metric, Run
from orchestrator.db.session import session_scope
from orchestrator.settings import Settings

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def make_client(database_url: str, storage: Path) -> TestClient:
    return TestClient(create_app(Settings(database_url=database_url, home_dir=storage), TOKEN))


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("storage")


@pytest.fixture
def client(database_url: str, storage: Path) -> Iterator[TestClient]:
    with make_client(database_url, storage) as c:
        yield c


def submit(client: TestClient, body: dict) -> int:
    resp = client.post("/api/grids", json=body, headers=AUTH)
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


def test_minimal_body_creates_grid_with_queued_runs(client: TestClient) -> None:
    grid_id = submit(client, {"name": "x", "arms": ["A", "B"]})
    grid = client.get(f"/api/grids/{grid_id}").json()
    assert grid["name"] == "x" and grid["control"] == "A"
    assert [(r["arm"], r["state"], r["position"]) for r in grid["runs"]] == [("A", "queued", 0), ("B", "queued", 1)]
    assert grid["runs"][0]["recon_lpips"] is None and grid["runs"][0]["latest_step"] is None
    run = client.get(f"/api/runs/{grid['runs'][1]['id']}").json()
    assert run["spec"]["tread"]["enabled"] is True and run["spec"]["name"] == "B"


def test_writes_need_the_token(client: TestClient) -> None:
    body = {"name": "x", "arms": ["A"]}
    assert client.post("/api/grids", json=body).status_code == 401
    assert client.post("/api/grids", json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.post("/api/runs/1/stop").status_code == 401


@pytest.mark.parametrize(
    "header",
    [
        "Bearer t\xe9".encode("latin-1"),  # non-ASCII: compare_digest on str would raise TypeError (a 500)
        "Bearer test-tok\xe9n".encode("latin-1"),
        b"Bearer",  # no credentials
        b"Basic dGVzdDp0b2tlbg==",  # another scheme
        b"test-token",  # the token without a scheme
    ],
)
def test_bad_authorization_headers_are_401_never_500(client: TestClient, header: bytes) -> None:
    resp = client.post("/api/grids", json={"name": "x", "arms": ["A"]}, headers={"Authorization": header})
    assert resp.status_code == 401, resp.text
    assert resp.headers["www-authenticate"] == "Bearer"


def test_negative_lr_names_its_path(client: TestClient) -> None:
    resp = client.post(
        "/api/grids", json={"name": "x", "arms": ["A"], "overrides": {"schedule": {"lr": -1e-4}}}, headers=AUTH
    )
    assert resp.status_code == 422
    (err,) = resp.json()["detail"]
    assert err["loc"] == ["body", "overrides", "schedule", "lr"]
    assert "greater than 0" in err["msg"]


def test_misplaced_asymflow_names_the_key(client: TestClient) -> None:
    # The source study's mistake: an AsymFlow block nested under the optimizer was silently ignored.
    inline = {"name": "G2", "parent": "F", "optimizer": {"asymflow": {"rank": 8}}}
    resp = client.post("/api/grids", json={"name": "x", "arms": ["A", inline]}, headers=AUTH)
    assert resp.status_code == 422
    (err,) = resp.json()["detail"]
    assert err["loc"] == ["body", "arms", 1, "optimizer", "asymflow"]
    assert err["type"] == "extra_forbidden"


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"name": "x", "arms": ["Z"]}, ["body", "arms", 0]),
        ({"name": "x", "arms": ["A", {"parent": "Q"}]}, ["body", "arms", 1, "parent"]),
        ({"name": "x", "arms": ["A", "B"], "control": "C"}, ["body", "control"]),
        ({"name": "x", "arms": ["A", "A"]}, ["body", "arms"]),
        ({"name": "x", "arms": ["A"], "overrides": {"name": "B"}}, ["body", "overrides", "name"]),
        ({"name": "x", "arms": []}, ["body", "arms"]),
        ({"name": "", "arms": ["A"]}, ["body", "name"]),
        ({"name": "x\x00", "arms": ["A"]}, ["body", "name"]),
        ({"name": "x", "arms": ["A"], "overrides": {"model": {"size": "huge"}}}, ["body", "overrides", "model", "size"]),  # noqa: E501
        # What Postgres cannot store must be a 422, not a 500 from the database.
        ({"name": "x", "arms": [{"description": "a\x00"}]}, ["body", "arms", 0, "description"]),
        ({"name": "x", "arms": [{"name": "N" * 65}]}, ["body", "arms", 0, "name"]),
        ({"name": "x" * 201, "arms": ["A"]}, ["body", "name"]),
    ],
)
def test_bad_grids_are_422_with_paths(client: TestClient, body: dict, loc: list) -> None:
    resp = client.post("/api/grids", json=body, headers=AUTH)
    assert resp.status_code == 422, resp.text
    assert loc in [e["loc"] for e in resp.json()["detail"]]


def test_non_finite_numbers_are_422(client: TestClient) -> None:
    # Python's JSON parser accepts Infinity; Postgres JSON would not store it.
    body = '{"name": "x", "arms": ["A"], "overrides": {"schedule": {"lr": Infinity}}}'
    resp = client.post("/api/grids", content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert resp.status_code == 422
    assert resp.json()["detail"][0]["loc"] == ["body", "overrides", "schedule", "lr"]


def test_unknown_ids_are_404(client: TestClient) -> None:
    assert client.get("/api/grids/987654").status_code == 404
    assert client.get("/api/grids/-1").status_code == 404
    assert client.get("/api/runs/987654").status_code == 404
    assert client.get(f"/api/runs/{2**63}").status_code == 404  # beyond any integer key
    assert client.get("/api/runs/987654/metrics").status_code == 404
    assert client.post("/api/runs/987654/stop", headers=AUTH).status_code == 404


def test_grid_survives_restart(database_url: str, storage: Path) -> None:
    with make_client(database_url, storage) as c:
        grid_id = submit(c, {"name": "study", "arms": ["A", "B", "C", "D"], "control": "A"})
    # A new app on the same database: nothing lives in process memory.
    with make_client(database_url, storage) as c:
        grid = c.get(f"/api/grids/{grid_id}").json()
        assert [r["arm"] for r in grid["runs"]] == ["A", "B", "C", "D"]
        assert {r["state"] for r in grid["runs"]} == {"queued"} and grid["states"] == {"queued": 4}
        assert grid_id in [g["id"] for g in c.get("/api/grids").json()]


def test_latest_metrics_appear_in_the_grid(client: TestClient, database_url: str) -> None:
    grid_id = submit(client, {"name": "m", "arms": ["A"]})
    run_id = client.get(f"/api/grids/{grid_id}").json()["runs"][0]["id"]
    with session_scope(database_url) as s:
        s.add_all([Metric(run_id=run_id, step=step, recon_lpips=v) for step, v in ((500, 0.95), (1000, 0.93))])
    run = client.get(f"/api/grids/{grid_id}").json()["runs"][0]
    assert (run["latest_step"], run["recon_lpips"]) == (1000, 0.93)
    assert [m["step"] for m in client.get(f"/api/runs/{run_id}/metrics").json()] == [500, 1000]


def test_stop_semantics(client: TestClient, database_url: str) -> None:
    grid_id = submit(client, {"name": "s", "arms": ["A", "B", "C"]})
    queued, running, done = (r["id"] for r in client.get(f"/api/grids/{grid_id}").json()["runs"])
    with session_scope(database_url) as s:
        s.get(Run, running).state = "running"
        s.get(Run, done).state = "completed"

    stopped = client.post(f"/api/runs/{queued}/stop", headers=AUTH).json()
    assert (stopped["state"], stopped["decision"], stopped["stop_requested"]) == ("stopped", "user", False)
    assert stopped["finished_at"] is not None

    # A running arm is only flagged; the launcher stops its worker and keeps its best checkpoint.
    flagged = client.post(f"/api/runs/{running}/stop", headers=AUTH).json()
    assert (flagged["state"], flagged["stop_requested"]) == ("running", True)

    assert client.post(f"/api/runs/{done}/stop", headers=AUTH).status_code == 409
    assert client.post(f"/api/runs/{queued}/stop", headers=AUTH).status_code == 409


def test_arms_and_health(client: TestClient) -> None:
    arms = {a["arm"]: a for a in client.get("/api/arms").json()}
    assert sorted(arms) == list("ABCDEFGHI")
    assert arms["G"]["changes"] == {"flow.kind": "asymflow"}
    assert client.get("/healthz").json()["status"] == "ok"
    assert client.get("/openapi.json").status_code == 200
