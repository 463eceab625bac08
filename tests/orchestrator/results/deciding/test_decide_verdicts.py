"""A deciding grid's verdicts end to end, through the controller's own decision pass on a real database and
into the report: an arm equal to its parent ends "equivalent" inside decide.margin (undecided inside a
margin too narrow for its interval), and a familywise grid (decide.error_rate) spends alpha/m on each of its
m comparisons where a per-comparison one spends alpha. The runs are not trained: each run's records are
written as a node would send them, so each test is a second.

The arms' records are built so that each arm equals its parent exactly on average: seed s of an arm is its
parent's loss plus (-1)^s (OFFSET + a per-image wobble), so the mean difference over its two seeds is 0 on
every image while the seeds spread; the interval is centred on 0 and its width comes from that spread.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from sqlalchemy import select

from orchestrator.db.models import DecisionLook, Grid, Metric, Run
from orchestrator.db.session import session_scope
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.results.deciding.decider import decide_due_grids
from orchestrator.results.deciding.decisions import ComparisonLook, look_comparisons
from orchestrator.results.reports.build import build_report
from orchestrator.results.reports.model import GridReport
from orchestrator.results.reports.render import RENDERERS
from orchestrator.settings import Settings
from tests.kit.settings import tiny_overrides

STEP = 20
SPLIT = 16  # held-out images, every one measured by the training records: the images at their budget
OFFSET = 0.002
ARMS = ["A", {"parent": "A", "name": "A-lr", "schedule": {"lr": 3.03e-4}},
        {"parent": "A", "name": "A-lr2", "schedule": {"lr": 3.06e-4}}]  # fmt: skip
AT_THE_BUDGET = {"min_seeds": 2, "max_seeds": 2}  # the first look is the last: the whole alpha is spent there


def flow_grid(run: Run) -> list[list[float]]:
    """The run's (image x 8 timesteps) flow loss on the whole split: each image's level, shared by every run;
    an arm other than A moves it by +-(OFFSET + the image's wobble), + on even seeds and - on odd ones."""
    draw = random.Random(0)
    levels = [0.5 + draw.gauss(0, 0.05) for _ in range(SPLIT)]
    wobble = [draw.gauss(0, 0.001) for _ in range(SPLIT)]
    sign = 0 if run.arm == "A" else (1 if run.seed % 2 == 0 else -1)
    return [[levels[i] + sign * (OFFSET + wobble[i]) + 0.01 * t for t in range(8)] for i in range(SPLIT)]


def records(run: Run) -> dict[str, Any]:
    grid = flow_grid(run)
    return {"step": STEP, "extra": {"val_flow_loss_grid": grid}, "val_flow_loss": sum(map(sum, grid)) / 8 / SPLIT,
            "val_flow_loss_n": SPLIT}  # fmt: skip


def decided(settings: Settings, name: str, arms: list, decide: dict) -> tuple[DecisionLook, list[ComparisonLook],
                                                                                GridReport]:  # fmt: skip
    """The grid submitted, its first seeds' records stored as nodes send them, the decision pass run: its one
    look, that look's comparisons and the grid's report."""
    overrides = tiny_overrides(STEP)
    overrides["data"]["held_out"] = overrides["eval"]["num_samples"] = SPLIT
    with session_scope(settings.database_url) as session:
        grid_id = create_grid(session, GridCreate(name=name, arms=arms, overrides=overrides, decide=decide)).id
    with session_scope(settings.database_url) as session:
        for run in session.scalars(select(Run).where(Run.grid_id == grid_id)):
            session.add(Metric(run_id=run.id, **records(run)))
            run.state, run.last_checkpoint_step, run.checkpoint_dir = "completed", STEP, f"/ckpt/{run.id}"
            run.node, run.nodes = "node-1", ["node-1"]
    assert decide_due_grids(settings) == [grid_id]
    with session_scope(settings.database_url) as session:
        (look,) = session.scalars(select(DecisionLook).where(DecisionLook.grid_id == grid_id))
        report = build_report(session, session.get(Grid, grid_id))
        session.expunge_all()
    return look, look_comparisons(look), report


def test_an_arm_equal_to_its_parent_ends_equivalent_and_the_report_says_why(settings: Settings) -> None:
    look, (c,), report = decided(settings, "equal", ARMS[:2], {**AT_THE_BUDGET, "margin": {"val_flow_ivw": 0.05}})
    assert look.final and (c.arm, c.decision, c.look, c.k, c.n) == ("A-lr", "equivalent", 1, 2, SPLIT)
    assert -0.05 < c.low < 0 < c.high < 0.05 and c.reason == "the interval lies inside +-0.05"
    (effect,) = [e for e in report.effects if e.decision is not None]
    assert (effect.decision, effect.decision_reason) == ("equivalent", c.reason)
    # The decision's own interval (the look's repeated one) travels with it, beside the row's descriptive one.
    assert (effect.decision_low, effect.decision_high) == (c.low, c.high)
    words = (f"equivalent (look 1, alpha spent 0.05, k=2, n=16; repeated CI [{c.low:+.4g}, {c.high:+.4g}]): "
             "the interval lies inside +-0.05")
    assert words in RENDERERS["md"](report) and words in RENDERERS["html"](report)
    assert '"decision_reason": "the interval lies inside +-0.05"' in RENDERERS["json"](report)
    header = ("Decided look by look, 2 to 2 seeds, at alpha 0.05 per comparison, held over all looks: 1 look(s), "
              "1 decided, 0 undecided, decision ended; spent 0 of 0.0667 GPU-hours (0%, decide.max_gpu_hours).")
    assert report.deciding == header and header in RENDERERS["md"](report)


def test_a_margin_narrower_than_the_interval_leaves_it_undecided(settings: Settings) -> None:
    _, (c,), report = decided(settings, "narrow", ARMS[:2], {**AT_THE_BUDGET, "margin": {"val_flow_ivw": 1e-5}})
    assert c.decision == "undecided" and c.reason.startswith("at the budget, neither excluded nor inside the margin")
    words = f"undecided (look 1, alpha spent 0.05, k=2, n=16; repeated CI [{c.low:+.4g}, {c.high:+.4g}]): at the budget"
    assert words in RENDERERS["md"](report)


@pytest.mark.parametrize(("error_rate", "each"), [("per-comparison", 0.05), ("familywise", 0.025)])
def test_a_familywise_grid_spends_alpha_over_m_on_each_comparison(settings: Settings, error_rate: str,
                                                                   each: float) -> None:  # fmt: skip
    """Two arms against their parent A (the control): m = 2 comparisons on the decided metric. At the last
    look each comparison has spent its whole alpha: 0.05 each per comparison, 0.025 each familywise."""
    decide = {**AT_THE_BUDGET, "error_rate": error_rate, "margin": {"val_flow_ivw": 0.05}}
    look, comparisons, report = decided(settings, error_rate, ARMS, decide)
    assert look.final and [(c.arm, c.against) for c in comparisons] == [("A-lr", "parent"), ("A-lr2", "parent")]
    assert [c.alpha_spent for c in comparisons] == [pytest.approx(each)] * 2
    rate = ("alpha 0.05 familywise over 2 comparisons (0.025 a comparison)" if error_rate == "familywise"
            else "alpha 0.05 per comparison")  # fmt: skip
    assert report.deciding is not None and f"at {rate}, held over all looks" in report.deciding
    assert f"alpha spent {each:g}" in RENDERERS["md"](report)
