"""A deciding grid read at a glance, in a real headless Chromium and in the report: what it spent against
decide.max_gpu_hours, the decided metric's rows first, the plain mean beside the decided headline marked
descriptive (no green "distinguishable across seeds" beside a decision), the alpha spent readable, the header
counting arms and runs apart, and CMMD's stand-in rows folded under their own line naming `ablate weights fetch`."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
from sqlalchemy import select

from model.flow_headline import headline_fields
from orchestrator.db.models import DecisionLook, Grid, utcnow
from orchestrator.db.session import session_scope
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.results.deciding.decisions import ComparisonLook
from orchestrator.results.reports.build import build_report
from orchestrator.results.reports.render import to_markdown
from orchestrator.runs.ingest import insert_metrics
from tests.orchestrator.dashboard.browser import needs_chromium

STANDIN = "clip-vit-l-14-336 small random stand-in (no weights)"
CAP, HOURS_PER_RUN, SAMPLES = 2.5, 0.01, 16
UNDECIDED = ComparisonLook(arm="A-lr", against="parent", other_arm="A", metric="val_flow_ivw", diff=0.01,
                           low=-0.2, high=0.18, k=3, n=8, decision="undecided", look=2, alpha_spent=8.03e-8,
                           fractions=[0.4, 1.0], reason="at the budget")  # fmt: skip


def record(shift: float, rng: np.random.Generator) -> dict:
    """A final checkpoint on 8 held-out images (8 timesteps) with 16 CMMD samples from a stand-in extractor."""
    grid = [[0.5 + 0.01 * i + shift + 0.02 * t + 0.0005 * rng.normal() for t in range(8)] for i in range(8)]
    cmmd = (1.0 + shift + rng.normal(0, 0.1, SAMPLES)).tolist()
    return {"step": 20, "val_flow_loss": sum(map(sum, grid)) / 64, "val_flow_loss_n": 8, "val_flow_loss_grid": grid,
            **headline_fields(grid), "gpu_hours": HOURS_PER_RUN, "cmmd": float(np.mean(cmmd)), "cmmd_n": SAMPLES,
            "cmmd_se": float(np.std(cmmd, ddof=1) / SAMPLES**0.5), "cmmd_extractor": STANDIN, "cmmd_samples": cmmd}


def deciding_grid(database_url: str) -> int:
    """A against A-lr, three seeds each (six runs of two arms), A-lr clearly worse on the plain mean; the latest
    look closed the headline undecided at its budget."""
    rng = np.random.default_rng(64)
    arms = ["A", {"parent": "A", "name": "A-lr", "schedule": {"lr": 3.03e-4},
                  "eval": {"distribution": {"metrics": ["cmmd"], "samples": SAMPLES}}}]  # fmt: skip
    with session_scope(database_url) as s:
        grid = create_grid(s, GridCreate(name="at a glance", arms=arms, overrides={"model": {"size": "tiny"}},
                                         decide={"min_seeds": 3, "max_seeds": 3, "max_gpu_hours": CAP}))  # fmt: skip
        for run in grid.runs:
            # Held HOURS_PER_RUN on its one GPU, as the controller recorded it: what the spend counts.
            run.state, run.finished_at = "completed", utcnow()
            run.started_at = run.finished_at - timedelta(hours=HOURS_PER_RUN)
            insert_metrics(s, run.id, [record(0.05 if run.arm == "A-lr" else 0.0, rng)])
        s.add(DecisionLook(grid_id=grid.id, wave=1, comparisons=[UNDECIDED.model_dump(mode="json")], actions=[],
                           final=True))  # fmt: skip
        return grid.id


def test_the_report_says_the_spend_leads_with_the_decision_and_marks_the_plain_mean(database_url: str) -> None:
    grid_id = deciding_grid(database_url)
    with session_scope(database_url) as s:
        report = build_report(s, s.scalars(select(Grid).where(Grid.id == grid_id)).one())
    assert report.deciding is not None and "spent 0.06 of 2.5 GPU-hours (2%, decide.max_gpu_hours)" in report.deciding
    assert [e.metric for e in report.effects][0] == "val_flow_ivw"
    plain = next(e for e in report.effects if e.metric == "val_flow_loss")
    assert plain.reading == "distinguishable across seeds" and plain.descriptive
    markdown = to_markdown(report)
    assert "| descriptive: distinguishable across seeds |" in markdown
    assert "| distinguishable across seeds |" not in markdown  # the decided row says it too: no call at alpha
    assert "undecided (look 2, alpha spent 8.03 × 10⁻⁸, k=3, n=8" in markdown


@needs_chromium
def test_the_grid_page_shows_the_spend_the_decision_first_and_folds_cmmd_apart(
    base_url: str, database_url: str, browser_context
) -> None:  # type: ignore[no-untyped-def]
    grid_id = deciding_grid(database_url)
    page = browser_context.new_page()
    page.goto(f"{base_url}/grids/{grid_id}")
    page.wait_for_selector("main#grid[data-ready='true']")
    assert page.inner_text("#grid-meta").startswith("2 arms x 3 seeds = 6 runs"), page.inner_text("#grid-meta")
    assert "spent 0.06 of 2.5 GPU-hours (2%, decide.max_gpu_hours)" in page.inner_text("#deciding .hint")
    metrics = page.locator("#effects tbody tr").evaluate_all("rows => rows.map(r => r.dataset.metric)")
    assert metrics[0] == "val_flow_ivw" and "cmmd" not in metrics, metrics
    decided = "#effects tbody tr[data-arm='A-lr'][data-metric='val_flow_ivw']"
    assert page.inner_text(f"{decided} td.decision").startswith("undecided · look 2 · α spent 8.03 × 10⁻⁸")
    plain = page.locator("#effects tbody tr[data-arm='A-lr'][data-metric='val_flow_loss'] td.reading")
    assert plain.inner_text() == "descriptive: distinguishable across seeds"
    assert "distinguishable-across-seeds" not in (plain.get_attribute("class") or "")
    assert page.is_hidden("#effects-standin")  # no LPIPS stand-in row: its fold stays shut
    fold = page.locator("#effects-standin-distribution")
    assert fold.is_visible() and "ablate weights fetch" in fold.locator("summary").inner_text()
    assert fold.locator("tbody tr[data-metric='cmmd']").count() >= 1
    page.close()
