"""The grid page's night plan in a real headless Chromium: an auto grid planned over a quad node, one run
started, then the plan redrawn by the launcher's re-planner: the page draws the planned slots with the
started run over them, names each run's GPUs, and follows the redrawn plan."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from orchestrator.dashboard.data import grid_detail, grid_version
from orchestrator.db.models import Grid, utcnow
from orchestrator.db.session import session_scope
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.runs.replan import Held, Replanner
from orchestrator.vocabulary import RunState
from tests.orchestrator.dashboard.browser import needs_chromium

TINY = {"model": {"size": "tiny"}, "schedule": {"batch_size": 8}}
PLAN = "figure.chart[data-key='plan']"


def planned_grid(database_url: str) -> tuple[int, int]:
    """An auto grid of A-D at seed size (hours of training) on a quad node, submitted an hour ago, its first
    planned run running since; (grid id, run id)."""
    with session_scope(database_url) as s:
        grid = create_grid(s, GridCreate(name="planned", arms=["A", "B", "C", "D"], gpus_per_arm="auto"),
                           nodes={"quad": 4})
        first = grid.plan["slots"][0]
        run = next(r for r in grid.runs if r.arm == first["arm"])
        grid.created_at = utcnow() - timedelta(hours=1)
        run.state, run.started_at, run.node = RunState.running, grid.created_at, "quad"
        return grid.id, run.id


def test_grid_detail_carries_the_plan_and_a_redraw_changes_the_version(database_url: str) -> None:
    grid_id, run_id = planned_grid(database_url)
    with session_scope(database_url) as s:
        grid = s.get(Grid, grid_id)
        assert grid is not None
        detail = grid_detail(s, grid)
        assert detail["plan"]["auto"] and len(detail["plan"]["slots"]) == 4
        before = grid_version(s, grid_id)
        queued = [r for r in grid.runs if r.state == RunState.queued]
        held = {run_id: Held("quad", next(r for r in grid.runs if r.id == run_id).spec["gpus"])}
        Replanner().redraw(s, queued, {"quad": 4}, held)
        s.flush()
        assert grid_detail(s, grid)["plan"]["drawn_at"] is not None
        assert grid_version(s, grid_id) != before  # the page's poll picks the redrawn plan up


@needs_chromium
def test_the_grid_page_draws_the_plan_with_the_runs_over_it(  # type: ignore[no-untyped-def]
    base_url: str, database_url: str, browser_context, tmp_path: Path
) -> None:
    grid_id, run_id = planned_grid(database_url)
    with session_scope(database_url) as s:
        arm = next(r.arm for r in s.get(Grid, grid_id).runs if r.id == run_id)  # type: ignore[union-attr]
    page = browser_context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))  # a bar wider than its points once threw here
    page.goto(f"{base_url}/grids/{grid_id}")
    page.wait_for_selector("main#grid[data-ready='true']")
    assert page.is_visible("section#plan")
    page.wait_for_selector(f"{PLAN}[data-drawn]")
    assert sorted(page.get_attribute(PLAN, "data-arms").split(",")) == list("ABCD")  # each run's planned slot
    assert page.get_attribute(PLAN, "data-drawn") == arm  # the one that started, drawn solid over it
    caption = page.inner_text(f"{PLAN} figcaption")
    assert "night " in caption and "lower bound" in caption and "as submitted" in caption
    assert "4 GPUs on quad" in page.inner_text("section#plan .plan-gpus")
    page.locator("section#plan").screenshot(path=str(tmp_path / "plan.png"))
    assert errors == []
    page.close()


@needs_chromium
def test_a_grid_without_a_plan_shows_no_plan_section(base_url: str, database_url: str, browser_context) -> None:  # type: ignore[no-untyped-def]
    with session_scope(database_url) as s:
        grid_id = create_grid(s, GridCreate(name="unplanned", arms=["A"], overrides=TINY)).id
    page = browser_context.new_page()
    page.goto(f"{base_url}/grids/{grid_id}")
    page.wait_for_selector("main#grid[data-ready='true']")
    assert not page.is_visible("section#plan")
    assert page.query_selector(PLAN) is None
    page.close()
