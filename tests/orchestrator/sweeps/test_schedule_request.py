"""A schedule names registered nodes or asks for nodes to rent (a NodeRequest): exactly one, and a bad
request is refused naming its field, over Python, REST and the stored row alike."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from orchestrator.app import create_app
from orchestrator.db.session import session_scope
from orchestrator.fleet.providers.request import NodeRequest
from orchestrator.settings import Settings
from orchestrator.sweeps.schedules import ScheduleCreate, ScheduleInvalid, create_schedule, get_schedule

GRID = {"name": "nightly", "arms": ["A", "B"], "overrides": {"model": {"size": "tiny"}}}
REQUEST = {"provider": "vast", "gpu": "RTX_4090", "gpus_per_node": 4, "nodes": 2, "max_price_per_gpu_hour": 0.45}


def _errors(**body: object) -> list[dict]:
    with pytest.raises(ValidationError) as info:
        ScheduleCreate(name="x", cron="0 22 * * *", grid=GRID, **body)  # type: ignore[arg-type]
    return info.value.errors()


def test_nodes_or_request_exactly_one_naming_the_field() -> None:
    [both] = _errors(nodes=["a"], request=REQUEST)
    assert both["loc"] == ("request",) and "not both" in both["msg"]
    [neither] = _errors()
    assert neither["loc"] == ("request",) and "give nodes" in neither["msg"]
    assert ScheduleCreate(name="x", cron="0 22 * * *", grid=GRID, request=REQUEST).request == NodeRequest(**REQUEST)


def test_a_bad_request_names_the_field_inside_it() -> None:
    [err] = _errors(request={**REQUEST, "max_price_per_gpu_hour": 0})
    assert err["loc"] == ("request", "max_price_per_gpu_hour")
    [err] = _errors(request={**REQUEST, "provider": "runpod", "min_reliability": 0.9})
    assert err["loc"] == ("request", "min_reliability") and "Vast" in err["msg"]
    [err] = _errors(request={**REQUEST, "gpus": 4})  # a misspelt key is refused, never dropped
    assert err["loc"] == ("request", "gpus") and err["type"] == "extra_forbidden"


def test_a_request_schedule_is_stored_with_no_nodes(database_url: str) -> None:
    body = ScheduleCreate(name="rent-nightly", cron="0 22 * * *", grid=GRID, request=REQUEST, budget=60)
    with session_scope(database_url) as session:
        create_schedule(session, body, now=datetime(2026, 1, 5, tzinfo=UTC))
    with session_scope(database_url) as session:
        row = get_schedule(session, "rent-nightly")
        assert row.nodes == [] and NodeRequest.model_validate(row.request) == NodeRequest(**REQUEST)


def test_a_request_for_nodes_smaller_than_an_arm_is_refused_naming_the_arm(database_url: str) -> None:
    grid = {**GRID, "arms": ["A", {"parent": "D", "name": "D-wide", "gpus": 4}]}
    small = ScheduleCreate(name="too-small", cron="0 22 * * *", grid=grid, request={**REQUEST, "gpus_per_node": 2})
    with session_scope(database_url) as session, pytest.raises(ScheduleInvalid) as info:
        create_schedule(session, small)
    [err] = info.value.errors
    assert err["loc"] == ["grid", "arms", 1, "gpus"] and "arm D-wide asks for 4 GPUs" in err["msg"]
    with session_scope(database_url) as session:  # quad nodes fit it
        create_schedule(session, small.model_copy(update={"name": "quad", "request": NodeRequest(**REQUEST)}))


def test_request_schedules_over_rest(database_url: str) -> None:
    client = TestClient(create_app(Settings(database_url=database_url), "tok"))
    auth = {"Authorization": "Bearer tok"}
    body = {"name": "rest-rent", "cron": "0 23 * * *", "grid": GRID, "request": REQUEST}
    bad = client.post("/api/schedules", json={**body, "request": {**REQUEST, "nodes": 0}}, headers=auth)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "request", "nodes"]
    created = client.post("/api/schedules", json=body, headers=auth)
    assert created.status_code == 201, created.text
    assert created.json()["request"]["max_price_per_gpu_hour"] == 0.45 and created.json()["nodes"] == []


@pytest.mark.usefixtures("cli_controller")  # the commands ask a controller on the module's database
def test_request_schedules_from_the_cli(database_url: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    import yaml
    from typer.testing import CliRunner

    from orchestrator.cli import _register, app

    _register()
    monkeypatch.setenv("COLUMNS", "200")
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(GRID))
    (tmp_path / "rent.yaml").write_text(yaml.safe_dump(REQUEST))
    args = ["schedules", "create", "cli-rent", "--cron", "0 22 * * *", "--grid", str(tmp_path / "grid.yaml")]
    made = CliRunner().invoke(app, [*args, "--request", str(tmp_path / "rent.yaml")])
    assert made.exit_code == 0, made.output
    listed = CliRunner().invoke(app, ["schedules", "list"])
    assert "rent 2x 4x RTX_4090 @vast <= 0.45/GPU-h" in listed.output
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({**REQUEST, "provider": "aws"}))
    bad = CliRunner().invoke(app, [*args[:2], "cli-bad", *args[3:], "--request", str(tmp_path / "bad.yaml")])
    assert bad.exit_code != 0 and "request.provider" in str(bad.exception)
