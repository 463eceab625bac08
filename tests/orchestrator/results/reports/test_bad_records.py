"""One bad stored record never fails a grid's page: report.html/json/md and the dashboard's grid data stay
200 and name the record they left out, with every other arm's comparisons intact.

The records are stored as they were before ingest checked a record's lists (or as an import stores
them): a text grid, text timesteps, an integer skipped_files, per-sample values of 1e200, SEs of 1e-100
on two arms (a 0/0 Welch df), and an honest diverged arm whose NaN cells are stored as "nan" (the README
test's sweep: `TypeError: must be real number, not str`). Each made every load of these pages a 500.
"""

from __future__ import annotations

import math

import pytest
from fastapi.testclient import TestClient

from orchestrator.db.models import Metric, Run
from orchestrator.db.session import session_scope
from orchestrator.runs.ingest import metric_values
from orchestrator.settings import Settings
from tests.kit.settings import AUTH
from worker.protocol import jsonable

# 4 images x the 8 timesteps the flow headline's fixed weights are for
GRID = [[0.40 + 0.01 * t for t in range(8)], [0.50 + 0.02 * t for t in range(8)], [0.30 + 0.015 * t for t in range(8)],
        [0.45 + 0.005 * t for t in range(8)]]  # fmt: skip


def _flow(grid: list[list[float]], **extra: object) -> dict:
    """A checkpoint's flow-loss fields as the trainer writes them (model/evaluate.py flow_loss_metrics)."""
    per_image = [sum(row) / len(row) for row in grid]
    return {"step": 100, "val_flow_loss": 0.5, "val_flow_loss_se": 0.01, "val_flow_loss_n": len(grid),
            "val_flow_loss_samples": per_image, "val_flow_loss_grid": grid,
            "val_flow_loss_t": [(t + 0.5) / 8 for t in range(8)],
            "val_flow_loss_by_t": [sum(c) / len(c) for c in zip(*grid, strict=True)], "recon_lpips": 0.5,
            "recon_lpips_se": 0.01, "recon_lpips_n": 4, "lpips_backbone": "alexnet", **extra}  # fmt: skip


# arm -> the record its run stored (A: the control, honest; the rest, one bad shape each)
RECORDS = {
    "A": _flow(GRID),
    "B": _flow([[x + 0.01 for x in row] for row in GRID]),  # honest: pairs with A
    "C": _flow([[0.4, math.nan, *GRID[0][2:]], *GRID[1:]], train_loss=math.nan),  # diverged: "nan" cells once stored
    "D": _flow(GRID, val_flow_loss_grid="text", val_flow_loss_t="0.25,0.75", skipped_files=7),
    "E": _flow(GRID, val_flow_loss_samples=[1e200, -1e200, 1e200, 1e200], recon_lpips_samples=[1e200] * 4),
    "F": _flow(GRID, recon_lpips_se=1e-100, val_flow_loss_se=1e-100),
    "G": _flow(GRID, recon_lpips_se=1e-100, val_flow_loss_se=1e-100, val_flow_loss_by_t=["x", None]),
}


@pytest.fixture(scope="module")
def grid_id(client: TestClient, settings: Settings) -> int:
    # G's parent is F: two arms with SEs of 1e-100 compared (Welch's df was 0/0)
    arms = ["A", *({"name": arm, "parent": "F" if arm == "G" else "A"} for arm in list(RECORDS)[1:])]
    resp = client.post("/api/grids", json={"name": "bad-records", "arms": arms, "control": "A"}, headers=AUTH)
    assert resp.status_code == 201, resp.text
    grid = resp.json()["id"]
    with session_scope(settings.database_url) as session:
        for run in session.query(Run).filter(Run.grid_id == grid):
            values = metric_values(jsonable(RECORDS[run.arm]))
            values["extra"].update({k: v for k, v in RECORDS[run.arm].items() if k in ("val_flow_loss_grid",
                                    "val_flow_loss_t", "skipped_files", "val_flow_loss_samples",
                                    "recon_lpips_samples") and run.arm in "DE"})  # fmt: skip - as once stored
            session.add(Metric(run_id=run.id, step=100, **values))
            run.state = "completed"
    return grid


def test_every_page_of_a_grid_with_bad_records_answers_and_names_them(client: TestClient, grid_id: int) -> None:
    for fmt in ("json", "html", "md"):
        resp = client.get(f"/api/grids/{grid_id}/report.{fmt}")
        assert resp.status_code == 200, (fmt, resp.text[:500])
    report = client.get(f"/api/grids/{grid_id}/report.json").json()
    left_out = report["unreadable_records"]
    assert any(" (D, seed 0) step 100: val_flow_loss_grid: " in r for r in left_out), left_out
    assert any(" (D, seed 0) step 100: skipped_files: " in r for r in left_out), left_out
    assert any(" (G, seed 0) step 100: val_flow_loss_by_t: " in r for r in left_out), left_out
    assert "Records left out of the statistics" in client.get(f"/api/grids/{grid_id}/report.md").text
    detail = client.get(f"/api/dashboard/grids/{grid_id}")
    assert detail.status_code == 200, detail.text[:500]
    assert detail.json()["unreadable_records"] == left_out
    assert client.get(f"/grids/{grid_id}").status_code == 200


def test_the_honest_arm_keeps_its_paired_comparisons_and_the_others_say_why_not(client: TestClient,
                                                                               grid_id: int) -> None:  # fmt: skip
    arms = {a["arm"]: a for a in client.get(f"/api/grids/{grid_id}/report.json").json()["arms"]}

    def final(arm: str, metric: str) -> dict:
        return next(c for c in arms[arm]["comparisons"] if c["metric"] == metric and c["at"] == "final")

    assert final("B", "val_flow_ivw")["pairing"] == "paired" and final("B", "val_flow_ivw")["low"] is not None
    assert final("C", "val_flow_ivw")["words"].endswith("not measured on both")  # its grid holds a NaN
    assert final("C", "val_flow_loss")["pairing"] == "independent"  # its per-sample "nan": the SEs instead
    assert final("E", "val_flow_loss")["low"] is None and "values too large" in final("E", "val_flow_loss")["words"]
    for g in (final("G", "recon_lpips"), final("G", "val_flow_loss")):  # G against F: SEs of 1e-100 on both
        assert g["against"] == "parent" and g["low"] is not None and g["low"] <= g["diff"] <= g["high"]
