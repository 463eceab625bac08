"""An evaluation job skipped (issue 63): a diverged run's checkpoint measures NaN, so its job is marked
`skipped` with the reason and the other runs are measured (runs/evaluation_record.py diverged_skip). The
grid page showed nothing of it, so the run read as measured. Through the launcher's own EvaluationJobs on a
real database, then the grid's data and the page in a real headless Chromium."""

from __future__ import annotations

from pathlib import Path

from orchestrator.dashboard.data import grid_detail, grid_version
from orchestrator.db.models import Grid
from orchestrator.db.session import session_scope
from orchestrator.fleet.inventory import LOCAL
from tests.orchestrator.dashboard.browser import needs_chromium
from tests.orchestrator.runs.test_evaluation_trust import A_LOSS, IMAGES, STEP, _answer, _grid, _job, _jobs, _record

NAN = {"step": STEP, "val_flow_loss": "nan", "val_flow_loss_n": IMAGES, "val_flow_loss_se": "nan",
       "val_flow_loss_samples": ["nan"] * IMAGES, "evaluated_images": IMAGES, "wall_time_s": 3.0}  # fmt: skip


def _skipped(database_url: str, tmp_path: Path, name: str) -> tuple[int, int, int, str]:
    """Grid `name` (A, B) with B stopped as diverged, its evaluation's B job skipped and A's completed:
    (grid id, evaluation id, B's run id, the grid page's version token before the jobs ended)."""
    gid, eid = _grid(database_url, name)
    with session_scope(database_url) as session:
        diverged = _job(session, eid, "B").run
        diverged.decision, diverged.decision_step = "diverged", STEP
        before, b_id = grid_version(session, gid), diverged.id
    jobs = _jobs(database_url, tmp_path)
    assert _answer(jobs, database_url, eid, "B", LOCAL, NAN).state == "skipped"
    assert _answer(jobs, database_url, eid, "A", LOCAL, _record(A_LOSS)).state == "completed"
    return gid, eid, b_id, before


def test_the_grid_data_names_a_skipped_evaluation_job_with_its_reason(database_url: str, tmp_path: Path) -> None:
    gid, eid, b_id, before = _skipped(database_url, tmp_path, "skipped data")
    with session_scope(database_url) as session:
        grid = session.get_one(Grid, gid)
        rows = {r["arm"]: r for r in grid_detail(session, grid)["runs"]}
        after = grid_version(session, gid)
    assert rows["A"]["evaluations_skipped"] == []
    (job,) = rows["B"]["evaluations_skipped"]
    assert (job["evaluation"], job["step"], job["images"]) == (eid, STEP, IMAGES)
    assert job["reason"].startswith(f"run {b_id} diverged (the detector stopped it at step {STEP})"), job
    assert "measures val_flow_loss nan" in job["reason"]
    assert after != before  # a live page redraws when a job ends


@needs_chromium
def test_the_grid_page_shows_a_skipped_evaluation_job_with_its_reason(  # type: ignore[no-untyped-def]
    base_url: str, database_url: str, browser_context, tmp_path: Path
) -> None:
    gid, eid, b_id, _ = _skipped(database_url, tmp_path, "skipped page")
    page = browser_context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{base_url}/grids/{gid}")
    page.wait_for_selector("main#grid[data-ready='true']")
    tag = "#arms tr[data-arm='B'] .tag.evaluation-skipped"
    assert page.inner_text(tag) == f"evaluation {eid} skipped: run {b_id} diverged"
    assert "measures val_flow_loss nan" in (page.get_attribute(tag, "title") or "")
    assert page.query_selector("#arms tr[data-arm='A'] .tag.evaluation-skipped") is None
    line = "#banners details.notice[data-kind='evaluation-skipped']"
    assert page.get_attribute(line, "data-arms") == "B"
    assert f"Evaluation {eid} skipped (B)" in page.inner_text(f"{line} summary")
    why = page.text_content(f"{line} li[data-arm='B']") or ""
    assert f"run {b_id} diverged (the detector stopped it at step {STEP})" in why
    # the effects line names the evaluation the effects use and the run it skipped
    assert f"on evaluation {eid}:" in page.inner_text("#effects-seeds")
    assert "(skipped: B, on its own records)" in page.inner_text("#effects-seeds")
    assert errors == []
    page.close()
