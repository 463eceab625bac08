"""The night planner prices a distribution pass (eval.distribution): from the `distribution_seconds` earlier
records measured, per generated sample, else from FLOPs; a grid with the pass projects more GPU-hours than the
same grid without, and the plan says which part is the pass and where its price came from."""

from __future__ import annotations

import pytest

from model.spec import ArmSpec
from orchestrator.db.models import Grid, Metric, Run
from orchestrator.db.session import session_scope
from orchestrator.grids.distribution_price import (
    ACHIEVED_FLOPS,
    EXTRACTOR_FLOPS,
    EXTRACTOR_OF_METRIC,
    distribution_passes,
    estimated_distribution_seconds,
)
from orchestrator.grids.night import plan_grid
from orchestrator.grids.projection import ESTIMATED, MEASURED, Rates, measured_rates, project
from orchestrator.vocabulary import RunState

H100 = "NVIDIA H100 80GB HBM3"
PASS = {"metrics": ["cmmd", "fd_dinov2"], "samples": 64, "every": 2}


def spec_of(distribution: dict | None = None, steps: int = 3600, **schedule: int) -> ArmSpec:
    body: dict = {"model": {"size": "small"}, "data": {"held_out": 256},
                  "schedule": {"batch_size": 8, "steps": steps, **schedule}}  # fmt: skip
    if distribution is not None:
        body["eval"] = {"distribution": distribution}
    return ArmSpec.model_validate(body)


@pytest.mark.parametrize(
    ("steps", "every", "passes"),
    [(5000, 2, 5),  # 1000, 2000, 3000, 4000, 5000
     (5000, 3, 4),  # 1500, 3000, 4500 and the last
     (5200, 2, 6),  # 1000 ... 5000 and the last, 5200
     (400, 2, 1)],  # no checkpoint before the last
)  # fmt: skip
def test_a_run_measures_at_every_kth_checkpoint_and_the_last(steps: int, every: int, passes: int) -> None:
    spec = spec_of({**PASS, "every": every}, steps=steps, checkpoint_every=500)
    assert distribution_passes(spec) == passes
    assert distribution_passes(spec_of(steps=steps, checkpoint_every=500)) == 0


def test_a_grid_with_the_pass_projects_more_gpu_hours_and_says_which_part_is_the_pass() -> None:
    plain, measured = spec_of(), spec_of(PASS)
    rates = Rates(None, {})
    without = plan_grid([("A", plain)], 1, {"node": 1}, rates, auto=False)
    with_pass = plan_grid([("A", measured)], 1, {"node": 1}, rates, auto=False)
    assert without is not None and with_pass is not None
    extra_h = estimated_distribution_seconds(measured) / 3600
    assert extra_h > 0
    assert with_pass.fixed_h["A"] == pytest.approx(without.fixed_h["A"] + extra_h, abs=1e-4)
    assert with_pass.night_h == pytest.approx(without.night_h + extra_h, abs=1e-3)
    assert with_pass.distribution_h == {"A": pytest.approx(extra_h, abs=1e-4)}
    assert with_pass.distribution_sources == {"A": ESTIMATED} and without.distribution_h == {}
    assert project(spec_of({**PASS, "samples": 128}), rates).distribution_hours > extra_h


def test_a_measured_pass_is_priced_per_sample_and_kept_out_of_the_start(database_url: str) -> None:
    """A run of 40 steps at 2 steps/s, 4 records 5 s of evaluation each and 2 of them a 12 s distribution pass
    at 64 samples, 104 s to its last record: 104 - 20 - 20 - 24 = 40 s of start. A planned run of the same arm
    at 256 samples pays 48 s a pass (12 / 64 s a sample), 4 passes at its cadence."""
    spec = spec_of(PASS)
    with session_scope(database_url) as session:
        grid = Grid(name="past", control_arm="A", overrides={}, seeds=1)
        run = Run(position=0, arm="A", spec=spec.model_dump(mode="json"), state=RunState.completed, gpu_name=H100)
        walls, passes = [20.0, 52.0, 72.0, 104.0], [None, 12.0, None, 12.0]
        run.metrics = [Metric(step=10 * (i + 1), iter_per_sec=2.0, wall_time_s=wall,
                              extra={"eval_time_s": 5.0, **({"distribution_seconds": s} if s else {})})
                       for i, (wall, s) in enumerate(zip(walls, passes, strict=True))]  # fmt: skip
        grid.runs = [run]
        session.add(grid)
    with session_scope(database_url) as session:
        rates = measured_rates(session, H100)
    planned = spec_of({**PASS, "samples": 256})
    projection = project(planned, rates)
    assert (projection.distribution_source, projection.fixed_source) == (MEASURED, MEASURED)
    assert distribution_passes(planned) == 4  # 3600 steps, checkpoints every 500: 1000, 2000, 3000 and the last
    assert projection.distribution_hours * 3600 == pytest.approx(4 * 256 * 12 / 64)
    assert projection.fixed_hours * 3600 == pytest.approx(40 + 8 * 5 + 4 * 48)
    # another sampler is another price: estimated again
    assert project(spec_of({**PASS, "sampler_steps": 25}), rates).distribution_source == ESTIMATED


def test_the_planners_extractors_are_the_registrys() -> None:
    from model.extractors.registry import EXTRACTOR_FOR_METRIC, EXTRACTORS

    assert EXTRACTOR_OF_METRIC == EXTRACTOR_FOR_METRIC
    for name in set(EXTRACTOR_OF_METRIC.values()):
        e = EXTRACTORS[name]
        assert EXTRACTOR_FLOPS[name] == 2 * 12 * e.width**2 * e.depth * ((e.resolution // 14) ** 2 + 1)
    assert 0.2e15 < ACHIEVED_FLOPS < 0.4e15


def test_a_deciding_grids_worst_case_pays_the_pass_too() -> None:
    from orchestrator.grids.deciding import DecideSpec, worst_case_gpu_hours

    decide = DecideSpec(max_seeds=3)
    plain = worst_case_gpu_hours([("A", spec_of()), ("B", spec_of())], "A", decide)
    with_pass = worst_case_gpu_hours([("A", spec_of(PASS)), ("B", spec_of(PASS))], "A", decide)
    assert plain is not None and with_pass is not None
    assert with_pass == pytest.approx(plain + 2 * 3 * estimated_distribution_seconds(spec_of(PASS)) / 3600)
