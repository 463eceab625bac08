"""A deciding grid's page in a real headless Chromium: the panel names each comparison still open and what is
being run for it, and the effects table has its decision column; a grid that does not decide shows neither.
The look is stored as the decision pass stores it (results/deciding/decider.py), the runs of its seed queued."""

from __future__ import annotations

from orchestrator.db.models import DecisionLook
from orchestrator.db.session import session_scope
from orchestrator.grids.deciding import add_seed
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.results.deciding.decisions import ComparisonLook
from tests.orchestrator.dashboard.browser import needs_chromium

OPEN = ComparisonLook(arm="A-lr", against="parent", other_arm="A", metric="val_flow_ivw", diff=-0.01, low=-0.2,
                      high=0.18, k=2, n=8, decision="open", look=1, alpha_spent=0.0004, fractions=[0.4],
                      action="seed")  # fmt: skip


@needs_chromium
def test_the_open_comparisons_and_what_runs_for_them(base_url: str, database_url: str, browser_context) -> None:  # type: ignore[no-untyped-def]
    arms = ["A", {"parent": "A", "name": "A-lr", "schedule": {"lr": 3.03e-4}}]
    with session_scope(database_url) as s:
        grid = create_grid(s, GridCreate(name="deciding", arms=arms, overrides={"model": {"size": "tiny"}},
                                         decide={"max_seeds": 4}))  # fmt: skip
        for run in grid.runs:
            run.state = "completed"
        added = add_seed(grid, ["A", "A-lr"])
        s.flush()
        action = {"action": "seed", "arms": ["A", "A-lr"], "runs": [r.id for r in added]}
        s.add(DecisionLook(grid_id=grid.id, wave=0, comparisons=[OPEN.model_dump(mode="json")], actions=[action]))
        deciding = grid.id
        plain = create_grid(s, GridCreate(name="plain", arms=["A", "B"], overrides={"model": {"size": "tiny"}})).id

    page = browser_context.new_page()
    page.goto(f"{base_url}/grids/{deciding}")
    page.wait_for_selector("main#grid[data-ready='true']")
    # the column is in the table's head (the table itself shows once an effect is measured)
    assert page.is_visible("#deciding") and page.locator("#effects th.decision").count() == 1
    hint = page.inner_text("#deciding .hint")
    assert "α = 0.05 per comparison at every look" in hint and "1 look(s)" in hint and "1 open" in hint
    assert page.locator("#deciding li").all_inner_texts() == [
        "A-lr vs A (parent) on val_flow_ivw: look 1, running one more seed of A-lr and A"]
    page.goto(f"{base_url}/grids/{plain}")
    page.wait_for_selector("main#grid[data-ready='true']")
    assert not page.is_visible("#deciding") and page.locator("#effects th.decision").count() == 0
    page.close()
