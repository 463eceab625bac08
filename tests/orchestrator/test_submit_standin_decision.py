"""A decision on a distribution metric whose extractor weights are not staged: the grid is accepted, and the
submit answer (POST /api/grids, `ablate submit`) warns, naming the metric and `ablate weights fetch NAME`.
Staged weights (in the controller's weights folder or the checkpoint store) leave the answer without one.
Weights are stood in for by sparse files of the pinned size: the check reads presence and size, never bytes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from model.extractors.registry import EXTRACTORS
from orchestrator.settings import Settings
from tests.kit.net import controller_env
from tests.kit.settings import API_TOKEN

AUTH = {"Authorization": f"Bearer {API_TOKEN}"}
CLIP = "clip-vit-l-14-336"  # cmmd's extractor, at checkpoints and in evaluations alike


def body(name: str, margin: dict[str, float], metrics: list[str]) -> dict[str, Any]:
    distribution = {"metrics": metrics, "samples": 32}  # within the tiny split's held-out images
    overrides = {"model": {"size": "tiny"}, "schedule": {"steps": 10}, "eval": {"distribution": distribution}}
    return {"name": name, "arms": ["A", {"parent": "A", "name": "B", "schedule": {"lr": 3.03e-4}}],
            "overrides": overrides, "decide": {"margin": margin}}  # fmt: skip


def stage(folder: Path, name: str) -> None:
    """Each pinned file of extractor `name` under `folder`/<name>/, as a sparse file of its pinned size."""
    entry = EXTRACTORS[name]
    for pinned in entry.files:
        path = folder / entry.name / pinned.filename
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as fh:
            fh.truncate(pinned.size)


@pytest.fixture
def no_local_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The controller's weights folder: empty, and this test's own."""
    folder = tmp_path / "weights"
    folder.mkdir()
    monkeypatch.setenv("ABLATE_WEIGHTS_DIR", str(folder))
    return folder


def test_deciding_on_cmmd_with_no_weights_is_accepted_with_a_warning_naming_the_fix(
    client: TestClient, no_local_weights: Path
) -> None:
    resp = client.post("/api/grids", json=body("cmmd unstaged", {"cmmd": 0.0}, ["cmmd"]), headers=AUTH)
    assert resp.status_code == 201, resp.text
    (warning,) = resp.json()["warnings"]
    assert "'cmmd'" in warning and f"`ablate weights fetch {CLIP}`" in warning and "stand-in" in warning
    assert client.get(f"/api/grids/{resp.json()['id']}", headers=AUTH).status_code == 200  # stored all the same


def test_weights_staged_in_the_store_or_the_weights_folder_leave_no_warning(
    client: TestClient, settings: Settings, no_local_weights: Path, tmp_path: Path
) -> None:
    stage(no_local_weights, CLIP)  # in the controller's folder, which a node on this machine reads
    resp = client.post("/api/grids", json=body("cmmd local", {"cmmd": 0.0}, ["cmmd"]), headers=AUTH)
    assert resp.status_code == 201, resp.text
    assert resp.json()["warnings"] == []

    store = Path(settings.checkpoint_root.removeprefix("file://")) / "weights"
    (no_local_weights / CLIP / EXTRACTORS[CLIP].files[0].filename).unlink()
    stage(store, CLIP)  # staged for the nodes, as `ablate weights fetch` leaves it
    try:
        resp = client.post("/api/grids", json=body("cmmd staged", {"cmmd": 0.0}, ["cmmd"]), headers=AUTH)
        assert resp.status_code == 201, resp.text
        assert resp.json()["warnings"] == []
        # dino_mmd's extractors are still missing: only its decision is warned about
        resp = client.post("/api/grids", json=body("both", {"cmmd": 0.0, "dino_mmd": 0.0}, ["cmmd", "dino_mmd"]),
                           headers=AUTH)  # fmt: skip
        assert resp.status_code == 201, resp.text
        (warning,) = resp.json()["warnings"]
        assert "'dino_mmd'" in warning and "`ablate weights fetch dinov2-vit-b-14`" in warning
        assert "'cmmd'" not in warning and CLIP not in warning
    finally:
        (store / CLIP / EXTRACTORS[CLIP].files[0].filename).unlink()


def test_a_decision_on_a_training_metric_or_a_grid_that_does_not_decide_has_no_warning(
    client: TestClient, no_local_weights: Path
) -> None:
    resp = client.post("/api/grids", json=body("flow", {"val_flow_ivw": 0.0}, ["cmmd"]), headers=AUTH)
    assert resp.status_code == 201, resp.text
    assert resp.json()["warnings"] == []
    fixed = {k: v for k, v in body("fixed", {}, ["cmmd"]).items() if k != "decide"}
    resp = client.post("/api/grids", json=fixed, headers=AUTH)
    assert resp.status_code == 201, resp.text
    assert resp.json()["warnings"] == []


def test_ablate_submit_prints_the_warning_and_stdout_stays_the_id(
    database_url: str, tmp_path: Path, no_local_weights: Path
) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(body("cli cmmd", {"cmmd": 0.0}, ["cmmd"])))
    exe = str(Path(sys.executable).parent / "ablate")
    with controller_env(database_url, tmp_path / "home") as controller:
        proc = subprocess.run([exe, "submit", str(grid)], env={**os.environ, **controller}, capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().isdigit()
    assert "warning: decide.margin names 'cmmd'" in proc.stderr
    assert f"`ablate weights fetch {CLIP}`" in proc.stderr
