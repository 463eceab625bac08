"""A report of a real tiny grid (arms A and B trained on CPU, records ingested into a migrated
database): paired intervals from the stored per-sample values, samples embedded beside the control's,
the three formats over the API, and the report written exactly once when the grid has ended."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.db.models import Event, Run
from orchestrator.db.session import session_scope
from orchestrator.grids.arms import resolve
from orchestrator.results.reports.write import report_dir, write_due_reports
from orchestrator.runs.ingest import insert_metrics
from orchestrator.settings import Settings
from tests.kit.settings import AUTH, tiny_overrides
from worker.train import train_arm


@pytest.fixture(scope="module")
def grid_id(client: TestClient, settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> int:
    overrides = tiny_overrides(20)
    overrides["eval"]["num_samples"] = overrides["data"]["held_out"] = 4  # 4 pairs: a paired interval, 3 df
    resp = client.post("/api/grids", json={"name": "tiny", "arms": ["A", "B"], "overrides": overrides}, headers=AUTH)
    assert resp.status_code == 201, resp.text
    grid = client.get(f"/api/grids/{resp.json()['id']}").json()
    with session_scope(settings.database_url) as session:
        for row in grid["runs"]:
            run = session.get(Run, row["id"])
            out = tmp_path_factory.mktemp(f"run-{run.arm}")
            insert_metrics(session, run.id, list(train_arm(resolve(run.arm, overrides), out)))
            run.checkpoint_dir, run.state, run.best_step = str(out), "running", 10
    return grid["id"]


def test_report_has_paired_intervals_and_embedded_samples(client: TestClient, grid_id: int) -> None:
    report = client.get(f"/api/grids/{grid_id}/report.json").json()
    assert report["state"] == "in progress"  # runs still running: a report of where it stands
    b = next(a for a in report["arms"] if a["arm"] == "B")
    assert b["parent"] == "A" and b["changes"]  # B's one change against A (TREAD)
    recon = [c for c in b["comparisons"] if c["metric"] == "recon_lpips"]
    assert [(c["at"], c["step"]) for c in recon] == [("best", 10), ("final", 20)]
    assert all(c["pairing"] == "paired" and c["n"] == 4 and c["low"] < c["diff"] < c["high"] for c in recon)
    assert recon[0]["words"].startswith("B vs A (parent, best step 10): recon LPIPS ")
    assert b["samples"]["step"] == 10 and b["control_samples"]["arm"] == "A"
    kinds = {(i["kind"], i["index"]) for i in b["samples"]["images"]}
    assert {("target", 0), ("recon", 0), ("text", 0)} <= kinds
    assert all(i["data_uri"].startswith("data:image/png;base64,") for i in b["samples"]["images"])
    assert b["fallbacks"] and any("random_standin" in f for f in b["fallbacks"])  # the stand-in LPIPS, labelled
    # Effects at the final checkpoint: the flow loss's weighted headline judges and leads, its plain mean
    # follows (LPIPS is the stand-in, listed but not counted); one seed, so each interval covers evaluation
    # noise and says so. The ranking and each run's best are on the same headline.
    assert report["judge"] == "val_flow_ivw" and report["seeds"] == 1
    assert b["series"]["val_flow_ivw"][-1] == pytest.approx(b["final_value"])
    assert report["summary"]["primary_metric"] == "val_flow_ivw"
    assert report["summary"]["comparisons"] == 2 and report["summary"]["with_interval"] == 2
    effects = {e["metric"]: e for e in report["effects"] if e["arm"] == "B"}
    assert list(effects)[:2] == ["val_flow_ivw", "val_flow_loss"]  # the judge leads, its headline first
    assert effects["recon_lpips"]["standin"] and not effects["val_flow_loss"]["standin"]
    assert all(e["k"] == 1 and e["reading"] == "one seed: training noise not measured" for e in effects.values())
    flow = [c for c in b["comparisons"] if c["metric"] == "val_flow_loss"]
    assert all(c["pairing"] == "paired" and c["n"] == 4 and c["low"] < c["diff"] < c["high"] for c in flow)


def test_html_and_markdown_over_the_api(client: TestClient, grid_id: int) -> None:
    html = client.get(f"/api/grids/{grid_id}/report.html")
    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
    assert html.text.count('src="data:image/png;base64,') >= 6 and "<svg" in html.text
    md = client.get(f"/api/grids/{grid_id}/report.md")
    assert md.headers["content-type"].startswith("text/markdown") and "## B" in md.text
    assert client.get(f"/api/grids/{grid_id}/report.pdf").status_code == 422
    assert client.get("/api/grids/999999/report.json").status_code == 404
    page = client.get(f"/grids/{grid_id}")
    assert f'href="/api/grids/{grid_id}/report.html"' in page.text  # linked from the dashboard


def test_the_report_is_written_once_when_the_grid_ends(grid_id: int, settings: Settings) -> None:
    assert grid_id not in write_due_reports(settings)  # still running
    with session_scope(settings.database_url) as session:
        for run in session.query(Run).filter(Run.grid_id == grid_id):
            run.state = "completed"
    assert grid_id in write_due_reports(settings)
    out = report_dir(settings, grid_id)
    assert json.loads((out / "report.json").read_text())["state"] == "finished"
    assert (out / "report.html").stat().st_size > 0 and (out / "report.md").exists()
    assert grid_id not in write_due_reports(settings)  # once
    with session_scope(settings.database_url) as session:
        kinds = [e.kind for e in session.query(Event).filter(Event.grid_id == grid_id, Event.run_id.is_(None))]
    assert kinds.count("report.written") == 1
    assert Path(out).is_relative_to(settings.home_dir)
