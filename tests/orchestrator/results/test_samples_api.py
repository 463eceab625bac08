"""Sample images through the API: listed by step from the records, served from the run's folder or,
when the node is gone, from checkpoint storage; a sweep's copy-back carries them. Real tiny training
on CPU writes the images; a real migrated database holds the records."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from orchestrator.app import create_app
from orchestrator.db.models import Run
from orchestrator.db.session import session_scope
from orchestrator.grids.arms import resolve
from orchestrator.runs.ingest import insert_metrics
from orchestrator.runs.storage import download_run
from orchestrator.settings import Settings
from tests.kit.settings import tiny_overrides
from worker.train import train_arm

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("run")
    return out, list(train_arm(resolve("A", tiny_overrides(20)), out))


@pytest.fixture
def client(database_url: str, tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(database_url=database_url, home_dir=tmp_path), TOKEN)) as c:
        yield c


def _run_with(client: TestClient, database_url: str, records: list[dict[str, Any]], **columns: Any) -> int:
    resp = client.post("/api/grids", json={"name": "samples", "arms": ["A"]}, headers=AUTH)
    grid = client.get(f"/api/grids/{resp.json()['id']}").json()
    run_id = grid["runs"][0]["id"]
    with session_scope(database_url) as session:
        insert_metrics(session, run_id, records)
        run = session.get(Run, run_id)
        for key, value in columns.items():
            setattr(run, key, value)
    return run_id


def test_samples_are_listed_by_step_and_served_from_the_run_folder(client, database_url, trained) -> None:
    out, records = trained
    run_id = _run_with(client, database_url, records, checkpoint_dir=str(out), best_step=10)
    listed = client.get(f"/api/runs/{run_id}/samples").json()
    assert [(s["step"], s["is_best"], s["final"]) for s in listed] == [(10, True, False), (20, False, True)]
    files = {f["file"]: f for f in listed[1]["files"]}
    assert {"target_0.png", "recon_0.png", "text_0.png", "caption_0.png", "edit_0.png"} <= set(files)
    png = client.get(files["recon_0.png"]["url"])
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert png.content == (out / "samples" / "step_0000020" / "recon_0.png").read_bytes()
    assert len(png.content) == files["recon_0.png"]["bytes"]
    missing = client.get(f"/api/runs/{run_id}/samples/30/recon_0.png")
    assert missing.status_code == 404 and "GET /api/runs" in missing.json()["detail"]
    # Only sample names: nothing else in the run's folder is reachable.
    assert client.get(f"/api/runs/{run_id}/samples/20/..%2Fmetrics.jsonl").status_code in (404, 422)
    assert client.get(f"/api/runs/{run_id}/samples/20/best.pt").status_code == 422
    assert client.get("/api/runs/999999/samples").status_code == 404


def test_a_gone_node_serves_samples_from_checkpoint_storage(client, database_url, trained, tmp_path) -> None:
    out, records = trained
    store = tmp_path / "store" / "run-x"
    shutil.copytree(out / "samples", store / "samples")  # what worker/checkpoint_store.py uploads
    run_id = _run_with(client, database_url, records, checkpoint_dir=str(tmp_path / "gone"),
                       checkpoint_url=f"file://{store}")  # fmt: skip
    png = client.get(f"/api/runs/{run_id}/samples/10/text_1.png")
    assert png.status_code == 200
    assert png.content == (out / "samples" / "step_0000010" / "text_1.png").read_bytes()


def test_copy_back_carries_samples_and_nothing_outside_them(trained, tmp_path) -> None:
    out, _ = trained
    store = tmp_path / "store"
    shutil.copytree(out / "samples", store / "samples")
    (store / "metrics.jsonl").write_text("{}\n")
    (store / "samples" / "step_0000010" / "notes.txt").write_text("not a sample")
    (store / "samples" / "elsewhere").mkdir()
    (store / "samples" / "elsewhere" / "recon_0.png").write_bytes(b"x")
    local = tmp_path / "back"
    download_run(f"file://{store}", {}, local, 1 << 30)
    copied = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    expected = sorted(p.relative_to(out).as_posix() for p in (out / "samples").rglob("*.png"))
    assert copied == sorted(["metrics.jsonl", *expected])
