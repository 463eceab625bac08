"""plan_look, the look as one pure function (issue 62): a comparison is first evaluated on every image the
split allows, with no alpha spent, where that costs little beside a seed; then seeds are bought to the
planned counts (2, 3, 4, 5, 6, 8), not one at a time; a cap refuses the work and closes what is open."""

from __future__ import annotations

from orchestrator.grids.deciding import DecideSpec
from orchestrator.results.deciding.plan_look import LookState, Reading, plan_look, planned_seeds
from orchestrator.results.deciding.sequential import Costs, Variance

SEED_HOURS = {"A": 3.2, "B": 3.2}
IMAGE_HOURS = 10 / 64 / 3600  # one image on one run


def reading(k: int, n: int, diff: float = 0.001) -> Reading:
    return Reading(arm="B", against="parent", other_arm="A", metric="val_flow_ivw", diff=diff, low=None, high=None,
                   k=k, n=n, se=0.004, df=30.0, variance=Variance(0.002**2, 0.011**2, 0.004**2),
                   costs=Costs(3.2, 3.2, IMAGE_HOURS))  # fmt: skip


def state(k: int, n: int, asked: int | None, **kw: object) -> LookState:
    spec = DecideSpec(futility=0, **kw)  # type: ignore[arg-type]
    return LookState(readings=[reading(k, n)], decide=spec, look=1, seeds={"A": k, "B": k}, images_asked=asked,
                     max_images=256, readable=256, spent=0.0, seed_hours=SEED_HOURS, evaluation_start=0.0,
                     evaluation_image=IMAGE_HOURS * 2 * k)  # fmt: skip


def test_the_planned_seed_counts() -> None:
    assert planned_seeds(2, 8) == (2, 3, 4, 5, 6, 8)
    assert planned_seeds(1, 3) == (1, 2, 3)
    assert planned_seeds(2, 16) == (2, 3, 4, 5, 6, 8, 10, 12, 15, 16)


def test_the_split_is_evaluated_first_without_spending_alpha() -> None:
    plan = plan_look(state(2, 64, None))
    (c,) = plan.comparisons
    assert (c.decision, c.action, c.fractions, c.alpha_spent) == ("open", "images", [], 0.0)
    assert plan.work.images == 256 and not plan.work.seeds


def test_seeds_are_bought_to_the_next_planned_count() -> None:
    plan = plan_look(state(4, 256, 256))
    (c,) = plan.comparisons
    assert (c.decision, c.action, len(c.fractions), c.seeds) == ("open", "seed", 1, [4])
    assert plan.work.images is None and dict(plan.work.seeds) == {"A": 5, "B": 5}
    assert plan.work.hours == 2 * 1 * 3.2
    plan = plan_look(state(6, 256, 256))
    assert dict(plan.work.seeds) == {"A": 8, "B": 8}  # 6, then 8


def test_a_cap_refuses_the_work_and_closes_what_is_open() -> None:
    plan = plan_look(state(3, 256, 256, max_gpu_hours=5.0))  # a seed of both arms: 6.4 GPU-h
    (c,) = plan.comparisons
    assert not plan.work.seeds and (c.decision, c.action) == ("undecided", None)
    assert "at the GPU-hours budget" in c.reason
