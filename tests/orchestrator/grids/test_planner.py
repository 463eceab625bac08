"""The night planner on the quad night's measured figures (arms A-D on one node of four H100s: A 6.66 h on
one GPU, B, C and D 3.18 h each, 16.2 GPU-hours; A on 2 GPUs 2.04x, on 4 3.98x), and its rules: an
arm's GPUs on one node, a fixed count kept, GPUs already busy, the bounded search past many runs."""

from __future__ import annotations

import pytest

from orchestrator.grids import planner
from orchestrator.grids.planner import PlanNode, PlanRun, gpu_choices, plan_night, speedup

MEASURED = {2: 2.04, 4: 3.98}
QUAD = [PlanNode("quad", 4)]
ANY = gpu_choices(4)
B_C_D = (16.2 - 6.66) / 3  # 3.18 h each


def night_runs(seeds: int) -> list[PlanRun]:
    return [
        PlanRun(f"{arm}#{seed}", 6.66 if arm == "A" else B_C_D, ANY)
        for seed in range(seeds) for arm in "ABCD"
    ]  # fmt: skip


def test_four_arms_on_a_quad_node_come_within_2_percent_of_the_bound() -> None:
    plan = plan_night(night_runs(1), QUAD, MEASURED)
    assert plan.night == pytest.approx(16.2 / 4, rel=0.02)
    assert plan.night < 6.66 * 0.65  # today's night: A alone on one GPU
    assert plan.night >= plan.lower_bound - 1e-9
    assert plan.search == "exhaustive"
    gpu_hours = sum(s.gpus * (s.end - s.start) for s in plan.slots)
    assert gpu_hours <= 4 * plan.night + 1e-9  # never more GPUs at once than the node has (in sum)


def test_three_seeds_come_within_3_percent_of_12_2_hours() -> None:
    plan = plan_night(night_runs(3), QUAD, MEASURED)
    assert len(plan.slots) == 12
    assert plan.night == pytest.approx(48.6 / 4, rel=0.03)
    # one run per GPU in any order: about 13 h (three A runs of 6.66 h cannot pack)
    one_each = plan_night([PlanRun(r.name, r.hours, (1,)) for r in night_runs(3)], QUAD, MEASURED)
    assert one_each.night > 13.0 > plan.night


def test_no_moment_holds_more_gpus_than_a_node_has() -> None:
    plan = plan_night(night_runs(3), [PlanNode("a", 4), PlanNode("b", 2)], MEASURED)
    for node, size in (("a", 4), ("b", 2)):
        mine = [s for s in plan.slots if s.node == node]
        for t in {s.start for s in mine}:
            assert sum(s.gpus for s in mine if s.start <= t < s.end) <= size


def test_an_arms_gpus_sit_on_one_node() -> None:
    """Two nodes of two GPUs: four GPUs in all, but no run may take four."""
    plan = plan_night(night_runs(1), [PlanNode("a", 2), PlanNode("b", 2)], MEASURED)
    assert max(s.gpus for s in plan.slots) == 2
    # A takes both GPUs of one node (3.26 h); B, C and D follow each other on both GPUs of the other
    assert plan.night == pytest.approx(3 * B_C_D / 2.04)


def test_a_fixed_count_is_kept() -> None:
    runs = [PlanRun("A", 6.66, (1,)), *[PlanRun(a, B_C_D, ANY) for a in "BCD"]]
    plan = plan_night(runs, QUAD, MEASURED)
    assert plan.slot("A").gpus == 1  # type: ignore[union-attr]
    assert plan.night == pytest.approx(6.66)  # A alone bounds the night; the bound says so
    assert plan.lower_bound == pytest.approx(6.66)


def test_busy_gpus_start_the_queue_later() -> None:
    """Three GPUs held for 2 h by running runs: the queued run starts on the free one or waits."""
    plan = plan_night([PlanRun("D", 3.2, ANY)], [PlanNode("quad", 4, busy=(2.0, 2.0, 2.0))], MEASURED)
    slot = plan.slot("D")
    assert slot is not None
    # on 1 GPU now it ends at 3.2 h; on 4 GPUs after 2 h it ends at 2 + 3.2 / 3.98 = 2.80 h
    assert (slot.gpus, slot.start) == (4, 2.0)
    assert plan.night == pytest.approx(2.0 + 3.2 / 3.98)


def test_a_run_no_node_can_hold_is_unplaced() -> None:
    plan = plan_night([PlanRun("big", 1.0, (8,)), PlanRun("small", 1.0, ANY)], QUAD)
    assert plan.unplaced == ("big",)
    assert [s.run for s in plan.slots] == ["small"]


def test_default_scaling_is_0_98_per_doubling() -> None:
    assert speedup(1) == 1.0
    assert speedup(2) == pytest.approx(1.96)
    assert speedup(4) == pytest.approx(4 * 0.98**2)
    assert speedup(2, {2: 2.04}) == 2.04


def test_many_distinct_runs_use_the_bounded_greedy_search(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = [PlanRun(f"r{i}", 1.0 + 0.37 * i, ANY) for i in range(10)]  # 3^10 allotments
    plan = plan_night(runs, [PlanNode("a", 4), PlanNode("b", 4)], MEASURED)
    assert plan.search == "greedy"
    assert plan.night <= plan.lower_bound * 1.10
    monkeypatch.setattr(planner, "EXHAUSTIVE_LIMIT", 10**9)
    small = runs[:6]
    exhaustive = plan_night(small, QUAD, MEASURED)
    monkeypatch.setattr(planner, "EXHAUSTIVE_LIMIT", 1)
    greedy = plan_night(small, QUAD, MEASURED)
    assert greedy.search == "greedy"
    assert greedy.night <= exhaustive.night * 1.10  # the bounded search stays close to the best


def test_a_short_run_whose_fixed_cost_dominates_takes_one_gpu_and_a_long_one_spreads() -> None:
    """The fixed part (start, compile, evaluations) is paid on every GPU a run holds and no GPU count
    shortens it: at 160 steps (0.06 h fixed, 0.03 h of training) one GPU each beats any wide allotment;
    at 5000 steps the same fixed part barely moves the quad night off its bound."""
    short = [PlanRun(arm, 0.03 if arm != "A" else 0.06, ANY, fixed=0.06) for arm in "ABCD"]
    plan = plan_night(short, QUAD, MEASURED)
    assert {s.gpus for s in plan.slots} == {1}
    assert plan.night == pytest.approx(0.06 + 0.06)
    assert plan.lower_bound <= plan.night
    # the same runs without their fixed part: the plan spreads them (as it did on the GPU machine, where
    # the runs then took 274 s against its 27 s)
    assert max(s.gpus for s in plan_night([PlanRun(r.name, r.hours, ANY) for r in short], QUAD, MEASURED).slots) > 1
    long = [PlanRun(r.name, r.hours, r.choices, fixed=0.1) for r in night_runs(1)]
    assert plan_night(long, QUAD, MEASURED).night == pytest.approx((16.2 + 0.4) / 4, rel=0.03)
