"""A deciding grid's page in a real headless Chromium: the panel names the error rate the grid holds and each
comparison still open with what is being run for it, and the effects table has its decision and why columns;
a grid that does not decide shows none of them. The look is stored as the decision pass stores it
(results/deciding/decider.py), the runs of its seed queued, its first seeds' records as nodes send them."""

from __future__ import annotations

from model.flow_headline import headline_fields
from orchestrator.db.models import DecisionLook, Metric
from orchestrator.db.session import session_scope
from orchestrator.grids.deciding import add_seed
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.results.deciding.decisions import ComparisonLook
from tests.orchestrator.dashboard.browser import needs_chromium

OPEN = ComparisonLook(arm="A-lr", against="parent", other_arm="A", metric="val_flow_ivw", diff=-0.01, low=-0.2,
                      high=0.18, k=2, n=8, decision="open", look=1, alpha_spent=0.0004, fractions=[0.4],
                      action="seed", reason="open: the interval holds zero")  # fmt: skip


def checkpoint(run_id: int, shift: float) -> Metric:
    """A final checkpoint's records on 8 held-out images: each image's level, the run's shift, 8 timesteps."""
    grid = [[0.5 + 0.01 * i + shift + 0.02 * t for t in range(8)] for i in range(8)]
    return Metric(run_id=run_id, step=20, val_flow_loss=sum(map(sum, grid)) / 64, val_flow_loss_n=8,
                  extra={"val_flow_loss_grid": grid, **headline_fields(grid)})  # fmt: skip


@needs_chromium
def test_the_open_comparisons_and_what_runs_for_them(base_url: str, database_url: str, browser_context) -> None:  # type: ignore[no-untyped-def]
    arms = ["A", {"parent": "A", "name": "A-lr", "schedule": {"lr": 3.03e-4}}]
    with session_scope(database_url) as s:
        grid = create_grid(s, GridCreate(name="deciding", arms=arms, overrides={"model": {"size": "tiny"}},
                                         decide={"max_seeds": 4, "error_rate": "familywise",
                                                 "margin": {"val_flow_ivw": 0, "val_flow_loss": 0}}))  # fmt: skip
        for run, shift in zip(grid.runs, (0.0, 0.003, 0.001, -0.001), strict=True):  # A and A-lr, seeds 0 and 1
            run.state = "completed"
            s.add(checkpoint(run.id, shift))
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
    hint = page.inner_text("#deciding .hint")  # A-lr against A on two decided metrics: m = 2
    assert "alpha 0.05 familywise over 2 comparisons (0.025 a comparison) at every look" in hint, hint
    assert "1 look(s)" in hint and "1 open" in hint
    row = "#effects tbody tr[data-arm='A-lr'][data-metric='val_flow_ivw']"
    assert page.inner_text(f"{row} td.decision").startswith("open · look 1 · α spent 0.0004")
    assert page.inner_text(f"{row} td.why") == "open: the interval holds zero"
    assert page.locator("#deciding li").all_inner_texts() == [
        "A-lr vs A (parent) on val_flow_ivw: look 1, running one more seed of A-lr and A"]
    page.goto(f"{base_url}/grids/{plain}")
    page.wait_for_selector("main#grid[data-ready='true']")
    assert not page.is_visible("#deciding") and page.locator("#effects th.decision, #effects th.why").count() == 0
    page.close()
