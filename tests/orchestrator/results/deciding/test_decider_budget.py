"""A deciding grid's spend is bounded and what it closed stays closed, on a real database with the
controller's own decision pass. The runs and evaluations are not trained here: each wave's records are
written as a node would send them (a per-image flow grid on the held-out images every run shares, the
image's own level plus each seed's offset plus noise), so each test is a second, not a training.

- An evaluation that measures one image fewer than it asked for (an honest split with one unreadable
  held-out image) ends in one evaluation and two looks, the images budget the readable count, said on the
  grid; before, every look asked for the same images again without end.
- A comparison closed undecided is never judged again, nor paid for.
- decide.max_gpu_hours: no look queues work past it (the runs' measured GPU-hours and the next seed's).
- decide.max_looks and max_evaluations: the last look the grid may take, or an evaluation past the cap,
  closes what is open, with the reason.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from orchestrator.db.models import DecisionLook, Evaluation, Event, Grid, Metric, Run
from orchestrator.db.session import session_scope
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.results.deciding.decider import decide_due_grids
from orchestrator.results.deciding.decisions import ComparisonLook, look_comparisons
from orchestrator.settings import Settings
from tests.kit.settings import tiny_overrides

STEP = 20
SPLIT = 16  # held-out images
UNREADABLE = 5  # the split's image that no evaluation can read
ARMS = ["A", {"parent": "A", "name": "A-lr", "schedule": {"lr": 3.03e-4}}]
NODE = "node-1"
NEVER = {"alpha": 1e-9, "futility": 0}  # an alpha no comparison meets, futility off: open to the budget


def overrides(first_images: int, split: int = SPLIT) -> dict[str, Any]:
    tiny = tiny_overrides(STEP)
    tiny["data"]["held_out"], tiny["eval"]["num_samples"] = split, first_images
    return tiny


def flow_grid(run: Run, images: list[int]) -> list[list[float]]:
    """The run's (image x 8 timesteps) flow loss on `images` of the split: each image's level, shared by
    every run, plus the run's seed offset and noise, drawn the same for the same run wherever asked."""
    level = random.Random(0)
    levels = [0.5 + level.gauss(0, 0.05) for _ in range(max(images) + 1)]
    noise = random.Random(run.id)
    offset = noise.gauss(0, 0.01)
    return [[levels[i] + offset + noise.gauss(0, 0.002) for _ in range(8)] for i in images]


def records(run: Run, images: list[int], gpu_hours: float | None) -> dict[str, Any]:
    grid = flow_grid(run, images)
    return {"step": STEP, "extra": {"val_flow_loss_grid": grid}, "val_flow_loss": sum(map(sum, grid)) / 8 / len(grid),
            "val_flow_loss_n": len(grid), "gpu_hours": gpu_hours}  # fmt: skip


def run_wave(settings: Settings, grid_id: int, first_images: int, gpu_hours: float | None = None,
             job_seconds: float = 30.0, held_h: float = 0.0) -> None:  # fmt: skip
    """Every queued run trained (held `held_h` hours on its one GPU, as the controller's placement and end
    times say; its node claims `gpu_hours`) and every queued evaluation measured, as nodes would answer: an
    evaluation of n images measures those of the first n that can be read."""
    with session_scope(settings.database_url) as session:
        for run in session.scalars(select(Run).where(Run.grid_id == grid_id, Run.state == "queued")):
            session.add(Metric(run_id=run.id, **records(run, list(range(first_images)), gpu_hours)))
            run.state, run.last_checkpoint_step, run.checkpoint_dir = "completed", STEP, f"/ckpt/{run.id}"
            run.finished_at = datetime.now(UTC)
            run.started_at = run.finished_at - timedelta(hours=held_h)
            run.node, run.nodes = NODE, [NODE]
        for evaluation in session.scalars(select(Evaluation).where(Evaluation.grid_id == grid_id,
                                                                    Evaluation.state == "queued")):  # fmt: skip
            readable = [i for i in range(evaluation.images) if i != UNREADABLE]
            for row in evaluation.results:
                for name, value in records(row.run, readable, None).items():
                    setattr(row, name, value)
                row.state, row.gpu_seconds, row.node = "completed", job_seconds, NODE  # the run's own node
                row.started_at = datetime.now(UTC)
                row.finished_at = row.started_at + timedelta(seconds=30)  # as the controller saw it
            evaluation.state = "completed"


def submit(settings: Settings, name: str, decide: dict, first_images: int, split: int = SPLIT) -> int:
    with session_scope(settings.database_url) as session:
        return create_grid(session, GridCreate(name=name, arms=ARMS, overrides=overrides(first_images, split),
                                               decide=decide)).id  # fmt: skip


def looks_of(settings: Settings, grid_id: int) -> list[tuple[DecisionLook, list[ComparisonLook]]]:
    with session_scope(settings.database_url) as session:
        rows = session.scalars(select(DecisionLook).where(DecisionLook.grid_id == grid_id).order_by(DecisionLook.wave))
        out = [(look, look_comparisons(look)) for look in rows]
        session.expunge_all()
        return out


def events(settings: Settings, grid_id: int, kind: str) -> list[str]:
    with session_scope(settings.database_url) as session:
        return list(session.scalars(select(Event.message).where(Event.grid_id == grid_id, Event.kind == kind)))


def test_an_evaluation_short_of_one_unreadable_image_ends_the_decision(settings: Settings) -> None:
    """Training records on 4 images, two seeds at max_seeds: look 1 asks every run on the whole split (16);
    one image cannot be read, so the evaluation measures 15. That is the split's readable count: look 2 is
    the last. Before, look 2 asked for 16 again, and every look after it, without end."""
    grid_id = submit(settings, "short", {**NEVER, "min_seeds": 2, "max_seeds": 2}, first_images=4)
    for _ in range(8):  # more passes than the budget needs
        run_wave(settings, grid_id, first_images=4)
        decide_due_grids(settings)
    looks = looks_of(settings, grid_id)
    assert [(look.final, [a["action"] for a in look.actions]) for look, _ in looks] == [(False, ["images"]), (True, [])]
    assert looks[0][0].actions[0]["images"] == SPLIT
    (last,) = looks[1][1]
    assert (last.decision, last.action, last.n, last.look) == ("undecided", None, SPLIT - 1, 2)
    assert "images budget 15: the split's readable images" in last.reason, last.reason
    with session_scope(settings.database_url) as session:
        assert len(session.scalars(select(Evaluation).where(Evaluation.grid_id == grid_id)).all()) == 1
    (said,) = events(settings, grid_id, "decide.images_budget")
    assert "measured 15 of the 16 it asked for" in said


def test_a_comparison_closed_undecided_is_never_judged_or_paid_for_again(settings: Settings) -> None:
    """A look closed the comparison undecided (for futility) while the grid went on; at the next look it
    is kept as it was and buys nothing, though at this alpha a look judging it again would keep it open and
    ask for another seed."""
    grid_id = submit(settings, "closed", {**NEVER, "min_seeds": 2, "max_seeds": 4}, first_images=SPLIT)
    run_wave(settings, grid_id, first_images=SPLIT)
    closed = ComparisonLook(arm="A-lr", against="parent", other_arm="A", metric="val_flow_ivw", diff=0.001,
                            low=-0.02, high=0.02, k=2, n=SPLIT, decision="undecided", look=1, alpha_spent=1e-12,
                            fractions=[0.3], reason="futility: conditional power 0.01 at the budget")  # fmt: skip
    with session_scope(settings.database_url) as session:
        session.add(DecisionLook(grid_id=grid_id, wave=0, comparisons=[closed.model_dump(mode="json")],
                                 actions=[{"action": "seed", "arms": ["A"], "runs": [], "words": "seed"}]))  # fmt: skip
    assert decide_due_grids(settings) == [grid_id]
    (look, (kept,)) = looks_of(settings, grid_id)[1]
    assert (look.final, look.actions) == (True, [])
    assert (kept.decision, kept.look, kept.action, kept.reason) == ("undecided", 1, None, closed.reason)
    with session_scope(settings.database_url) as session:
        grid = session.get(Grid, grid_id)
        assert grid is not None and max(r.seed for r in grid.runs) == 1  # no seed bought for it


@pytest.mark.parametrize(("cap", "seeds_added"), [(5.0, 0), (6.0, 1)])
def test_no_look_queues_work_past_max_gpu_hours(settings: Settings, cap: float, seeds_added: int) -> None:
    """Two arms at two seeds, each run held 1 GPU-hour: 4 spent. One more seed of both arms costs 2 (the arms'
    mean), so a cap of 5 refuses it and the look is the last, saying why; 6 allows it."""
    decide = {**NEVER, "min_seeds": 2, "max_seeds": 4, "max_gpu_hours": cap}
    grid_id = submit(settings, f"cap-{cap}", decide, first_images=SPLIT)  # every image measured: seeds only
    run_wave(settings, grid_id, first_images=SPLIT, gpu_hours=1.0, held_h=1.0)
    decide_due_grids(settings)
    ((look, (c,)),) = looks_of(settings, grid_id)
    with session_scope(settings.database_url) as session:
        grid = session.get(Grid, grid_id)
        assert grid is not None and len(grid.runs) == 4 + 2 * seeds_added
    if seeds_added:
        assert (look.final, c.decision, c.action) == (False, "open", "seed")
        return
    assert (look.final, c.decision, c.action) == (True, "undecided", None)
    words = "at the GPU-hours budget: 4 spent, the next work 2 more, of 5 (decide.max_gpu_hours)"
    assert words in c.reason and events(settings, grid_id, "decide.budget") == [words]


@pytest.mark.parametrize("claim", [0.5, 1e-6, -1.0, float("nan")])
def test_the_gpu_hours_cap_counts_what_the_controller_held_not_what_nodes_claim(settings: Settings,
                                                                                claim: float) -> None:  # fmt: skip
    """Cap 2.5, every run held half an hour on its GPU: 4 runs have spent 2.0, and one more seed of both arms
    (1.0 at the arms' held mean) would pass the cap, whatever the nodes claim. Before, a node claiming 1e-6
    GPU-h for its runs made them free: the cap saw 4e-6 spent and bought seed after seed."""
    decide = {**NEVER, "min_seeds": 2, "max_seeds": 8, "max_gpu_hours": 2.5}
    grid_id = submit(settings, "lying", decide, first_images=SPLIT)
    for _ in range(4):
        run_wave(settings, grid_id, first_images=SPLIT, gpu_hours=claim, held_h=0.5)
        decide_due_grids(settings)
    with session_scope(settings.database_url) as session:
        grid = session.get(Grid, grid_id)
        assert grid is not None and len(grid.runs) == 4
    ((look, (c,)),) = looks_of(settings, grid_id)
    assert (look.final, c.decision, c.action) == (True, "undecided", None)
    words = "at the GPU-hours budget: 2 spent, the next work 1 more, of 2.5 (decide.max_gpu_hours)"
    assert words in c.reason and events(settings, grid_id, "decide.budget") == [words]


def test_the_last_look_max_looks_allows_closes_what_is_open(settings: Settings) -> None:
    grid_id = submit(settings, "looks", {**NEVER, "min_seeds": 2, "max_seeds": 8, "max_looks": 2}, first_images=SPLIT)
    for _ in range(5):
        run_wave(settings, grid_id, first_images=SPLIT)
        decide_due_grids(settings)
    looks = looks_of(settings, grid_id)
    assert [(look.final, c.decision, c.k) for look, (c,) in looks] == [(False, "open", 2), (True, "undecided", 3)]
    assert "at the looks budget: 2 looks (decide.max_looks)" in looks[1][1][0].reason


def test_an_images_action_past_max_evaluations_is_refused(settings: Settings) -> None:
    """The chooser asks every run on 16 images, but the grid may have no evaluation: the first look is the
    last, saying why, and nothing is queued."""
    decide = {**NEVER, "min_seeds": 2, "max_seeds": 2, "max_evaluations": 0}
    grid_id = submit(settings, "no-evaluations", decide, first_images=4)
    run_wave(settings, grid_id, first_images=4)
    decide_due_grids(settings)
    ((look, (c,)),) = looks_of(settings, grid_id)
    assert (look.final, look.actions, c.decision) == (True, [], "undecided")
    words = "at the evaluations budget: 0 evaluations (decide.max_evaluations)"
    assert words in c.reason and events(settings, grid_id, "decide.budget") == [words]
    with session_scope(settings.database_url) as session:
        assert session.scalars(select(Evaluation).where(Evaluation.grid_id == grid_id)).all() == []


def test_a_job_cost_past_what_the_controller_saw_neither_closes_the_grid_nor_prices_its_evaluations(
    settings: Settings,
) -> None:
    """Evaluation jobs stored with 2e29 GPU-seconds (a node's 1e29 s wall time, before the controller
    bounded it), 30 s apart as the controller saw them: the grid has spent 4 x 30 s, and its next
    evaluation (16 -> 64 of a 64-image split) is queued, not refused at the GPU-hours budget."""
    grid_id = submit(settings, "claimed", {**NEVER, "min_seeds": 2, "max_seeds": 2}, first_images=4, split=64)
    for _ in range(2):
        run_wave(settings, grid_id, first_images=4, job_seconds=2e29)
        decide_due_grids(settings)
    looks = looks_of(settings, grid_id)
    assert [[(a["action"], a["images"]) for a in look.actions] for look, _ in looks] == [[("images", 16)],
                                                                                      [("images", 64)]]
    assert events(settings, grid_id, "decide.budget") == []


def test_a_failing_look_leaves_one_event_saying_why(settings: Settings) -> None:
    """A stored look the pass cannot read (a comparison without its fields) fails the next look; the grid's
    events say so, with the error, once however many passes fail the same way (before, only the log did)."""
    grid_id = submit(settings, "fails", {**NEVER, "min_seeds": 2, "max_seeds": 4}, first_images=SPLIT)
    run_wave(settings, grid_id, first_images=SPLIT)
    with session_scope(settings.database_url) as session:
        session.add(DecisionLook(grid_id=grid_id, wave=0, comparisons=[{"arm": "A-lr"}],
                                 actions=[{"action": "seed", "arms": ["A"], "runs": [], "words": "seed"}]))  # fmt: skip
    assert decide_due_grids(settings) == [] and decide_due_grids(settings) == []
    (said,) = events(settings, grid_id, "decide.look_failed")
    assert said.startswith("the look failed and is tried again at the next pass: ValidationError"), said
