"""eval.distribution through POST /api/grids: a bad value is a 422 at its path, a good one is stored on the runs."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.kit.settings import API_TOKEN

AUTH = {"Authorization": f"Bearer {API_TOKEN}"}


def _body(distribution: dict) -> dict:
    return {"name": "quality", "arms": ["A"], "overrides": {"model": {"size": "tiny"}, "schedule": {"steps": 10},
                                                           "eval": {"distribution": distribution}}}  # fmt: skip


@pytest.mark.parametrize(
    ("distribution", "field"),
    [
        ({"metrics": ["cmmd", "is"]}, ["metrics", 1]),
        ({"metrics": ["cmmd"], "samples": 4097}, ["samples"]),
        ({"metrics": ["cmmd"], "every": -1}, ["every"]),
        ({"metrics": ["cmmd"], "sampler_steps": 0}, ["sampler_steps"]),
        ({"metrics": ["cmmd"], "guidance": 21}, ["guidance"]),
        ({"metrics": ["fd_dinov2"], "seed": 3}, ["seed"]),
    ],
)
def test_bad_distribution_values_are_422_at_their_path(client: TestClient, distribution: dict, field: list) -> None:
    resp = client.post("/api/grids", json=_body(distribution), headers=AUTH)
    assert resp.status_code == 422, resp.text
    assert ["body", "overrides", "eval", "distribution", *field] in [e["loc"] for e in resp.json()["detail"]]


def test_samples_past_the_held_out_images_is_422_naming_both(client: TestClient) -> None:
    resp = client.post("/api/grids", json=_body({"metrics": ["cmmd"], "samples": 100}), headers=AUTH)
    assert resp.status_code == 422, resp.text
    assert "eval.distribution.samples (100) exceeds data.held_out (64)" in resp.text


def test_the_spec_is_stored_on_each_run(client: TestClient) -> None:
    resp = client.post("/api/grids", json=_body({"metrics": ["cmmd", "fd_dinov2"], "samples": 32}), headers=AUTH)
    assert resp.status_code in (200, 201), resp.text
    grid = client.get(f"/api/grids/{resp.json()['id']}", headers=AUTH).json()
    assert grid["runs"]
    for summary in grid["runs"]:
        run = client.get(f"/api/runs/{summary['id']}", headers=AUTH).json()
        assert run["spec"]["eval"]["distribution"] == {"metrics": ["cmmd", "fd_dinov2"], "samples": 32, "every": 3,
                                                       "sampler_steps": 50, "guidance": 1.0}  # fmt: skip


def test_an_evaluation_asking_fid_says_why_without_pydantics_prefix(client: TestClient) -> None:
    resp = client.post("/api/grids/1/evaluations", json={"samples": 32, "metrics": ["fid"]}, headers=AUTH)
    assert resp.status_code == 422, resp.text
    error = resp.json()["detail"][0]
    assert error["loc"][:2] == ["body", "metrics"] and "use fd_dinov2" in error["msg"]
    assert not error["msg"].startswith("Value error"), error["msg"]
