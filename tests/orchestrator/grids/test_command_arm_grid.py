"""Command arms in a grid: stored as the run's spec when the operator allows them, 422s naming the field or
the setting otherwise, through the real API and a real database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.app import create_app
from orchestrator.settings import Settings

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CODE_DIRS = Path("/srv/ablate/code")


def mine(**over: object) -> dict:
    return {"name": "mine", "code": str(CODE_DIRS / "t"), "command": ["python", "train.py", "--lr", "3e-4"],
            "env": {"SEED": "1"}, "detector": {"metric": "val_loss"}, **over}


def client_for(database_url: str, storage: Path, **settings: object) -> TestClient:
    return TestClient(create_app(Settings(database_url=database_url, home_dir=storage, **settings), TOKEN))


@pytest.fixture
def allowed(database_url: str, tmp_path: Path) -> Iterator[TestClient]:
    with client_for(database_url, tmp_path, allow_commands=True, command_dirs=[CODE_DIRS]) as c:
        yield c


def errors_of(resp: object) -> list[dict]:
    assert resp.status_code == 422, resp.text  # type: ignore[attr-defined]
    return resp.json()["detail"]  # type: ignore[attr-defined]


def test_commands_are_refused_where_the_operator_did_not_allow_them(database_url: str, tmp_path: Path) -> None:
    with client_for(database_url, tmp_path) as off:  # the default: ABLATE_ALLOW_COMMANDS unset
        resp = off.post("/api/grids", json={"name": "g", "arms": ["A", mine()]}, headers=AUTH)
        (error,) = errors_of(resp)
        assert error["loc"][-3:] == ["arms", 1, "command"] and "ABLATE_ALLOW_COMMANDS" in error["msg"]
        # Writes need the token whatever the setting: a command is never run for a stranger.
        assert off.post("/api/grids", json={"name": "g", "arms": [mine()]}).status_code == 401


def test_an_allowed_command_arm_is_stored_on_its_run_beside_a_built_in_arm(allowed: TestClient) -> None:
    body = {"name": "g", "arms": ["A", mine()], "overrides": {"model": {"size": "tiny"}}}
    resp = allowed.post("/api/grids", json=body, headers=AUTH)
    assert resp.status_code == 201, resp.text
    runs = allowed.get(f"/api/grids/{resp.json()['id']}").json()["runs"]
    a, command = (allowed.get(f"/api/runs/{r['id']}").json()["spec"] for r in runs)
    assert a["command"] is None and a["model"]["size"] == "tiny"
    assert command["command"] == {"code": "/srv/ablate/code/t", "argv": ["python", "train.py", "--lr", "3e-4"],
                                  "env": {"SEED": "<hidden>"}, "gpus": 1, "stop_grace_s": 60.0, "term_grace_s": 30.0}
    # The overrides configure the built-in trainer; the command arm takes only its detector from them.
    assert command["model"]["size"] == "seed" and command["detector"]["metric"] == "val_loss"
    assert command["detector"]["ceiling"] is None  # LPIPS's ceiling means nothing for the script's metric


@pytest.mark.parametrize(
    ("arm", "loc", "words"),
    [
        (mine(code="/etc/ablate"), ["arms", 0, "code"], "ABLATE_COMMAND_DIRS"),
        (mine(code="/srv/ablate/code/../../etc"), ["arms", 0, "code"], "'..'"),
        (mine(command="python train.py"), ["arms", 0, "command"], "list"),
        (mine(command=[]), ["arms", 0, "command"], "at least 1"),
        (mine(gpus=0), ["arms", 0, "gpus"], "greater than 0"),
        (mine(gpus=17), ["arms", 0, "gpus"], "less than or equal to 16"),
        (mine(stop_grace_s=-1), ["arms", 0, "stop_grace_s"], "greater than or equal"),
        (mine(env={"1BAD": "x"}), ["arms", 0, "env", "1BAD", "[key]"], "pattern"),
        (mine(shell=True), ["arms", 0, "shell"], "fields are"),
        (mine(detector={}), ["arms", 0, "detector", "metric"], "detector.metric"),
        ({"name": "mine", "command": ["python"]}, ["arms", 0, "code"], "both code"),
    ],
)
def test_a_bad_command_arm_answers_422_naming_the_field(allowed: TestClient, arm: dict, loc: list, words: str) -> None:
    errors = errors_of(allowed.post("/api/grids", json={"name": "g", "arms": [arm]}, headers=AUTH))
    assert any(e["loc"][-len(loc):] == loc and words in e["msg"] for e in errors), errors


def test_overrides_cannot_turn_built_in_arms_into_commands(allowed: TestClient) -> None:
    body = {"name": "g", "arms": ["A"], "overrides": {"command": {"code": "/srv/ablate/code/t", "argv": ["sh"]}}}
    errors = errors_of(allowed.post("/api/grids", json=body, headers=AUTH))
    assert any(e["loc"][-2:] == ["overrides", "command"] for e in errors), errors


def test_a_command_arm_s_env_values_are_never_echoed_back(allowed: TestClient, database_url: str) -> None:
    secret = "wandb-key-0123456789abcdef"
    resp = allowed.post("/api/grids", json={"name": "g", "arms": [mine(env={"WANDB_API_KEY": secret})]}, headers=AUTH)
    assert resp.status_code == 201 and secret not in resp.text
    grid_id = resp.json()["id"]
    [run] = allowed.get(f"/api/grids/{grid_id}").json()["runs"]
    reads = [f"/api/runs/{run['id']}", f"/api/grids/{grid_id}", f"/api/dashboard/grids/{grid_id}",
             f"/api/grids/{grid_id}/report.json", f"/api/grids/{grid_id}/metrics.csv"]
    for path in reads:
        for headers in ({}, AUTH):  # anonymous (ABLATE_PRIVATE_READS=false) and the token holder alike
            got = allowed.get(path, headers=headers)
            assert got.status_code == 200 and secret not in got.text, path
    assert allowed.get(f"/api/runs/{run['id']}").json()["spec"]["command"]["env"] == {"WANDB_API_KEY": "<hidden>"}
    from orchestrator.db.models import Run
    from orchestrator.db.session import session_scope

    with session_scope(database_url) as session:  # the node that runs the arm still gets it
        assert session.get_one(Run, run["id"]).spec["command"]["env"] == {"WANDB_API_KEY": secret}


def test_a_schedule_s_command_arm_env_values_are_never_echoed_back(allowed: TestClient, database_url: str) -> None:
    secret = "wandb-key-0123456789abcdef"
    request = {"provider": "vast", "gpu": "RTX_4090", "gpus_per_node": 1, "nodes": 1, "max_price_per_gpu_hour": 0.5}
    grid = {"name": "g", "arms": [mine(env={"WANDB_API_KEY": secret}), "A"]}
    created = allowed.post("/api/schedules", json={"name": "nightly", "cron": "0 2 * * *", "grid": grid,
                                                   "request": request}, headers=AUTH)  # fmt: skip
    assert created.status_code == 201, created.text
    reads = [allowed.get("/api/schedules", headers=AUTH), allowed.get("/api/schedules/nightly", headers=AUTH),
             allowed.post("/api/schedules/nightly/pause", headers=AUTH)]
    assert [r.status_code for r in reads] == [200, 200, 200]
    for got in (created, *reads):
        assert secret not in got.text and '"WANDB_API_KEY":"<hidden>"' in got.text
    from sqlalchemy import select

    from orchestrator.db.models import Schedule
    from orchestrator.db.session import session_scope

    with session_scope(database_url) as session:  # each sweep's grid still gets it
        row = session.scalars(select(Schedule).where(Schedule.name == "nightly")).one()
        assert row.grid["arms"][0]["env"] == {"WANDB_API_KEY": secret} and row.grid["arms"][1] == "A"
