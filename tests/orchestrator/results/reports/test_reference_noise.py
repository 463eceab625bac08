"""An MMD effect's interval includes the reference images' noise (issue 62): the reference set is one draw
shared by every arm, seed and sample, so its part of a difference cancels only near the null and no seed or
sample spread shows it. Known truth by simulation through the product's path: a worker's record
(model/distribution_pass.py `score`), the report's per-seed `difference` and `across_seeds`; then the report
of a stored grid says the reference images are in its interval and budget."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from model.distribution_pass import score
from model.distribution_stats import CMMD_SIGMA
from orchestrator.db.models import Grid, Metric
from orchestrator.db.session import session_scope
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.results.reports.build import build_report
from orchestrator.results.reports.stats import across_arms, across_seeds, difference
from orchestrator.runs.ingest import insert_metrics

D, V, RHO = 8, 0.02, 0.8  # embeddings' dims and spread; RHO: the share of a sample's spread its prompt fixes
MU_REF = np.zeros(D)
MU_REF[0] = 0.7
MU_CONTROL = MU_REF + 0.3 * np.eye(D)[1]


def _k(m: np.ndarray, s: float) -> float:
    """E exp(-|delta|^2 / (2 sigma^2)) for delta ~ N(m, s I): the kernel's mean in closed form."""
    sig2 = CMMD_SIGMA**2
    return (1 + s / sig2) ** (-D / 2) * math.exp(-0.5 * float(m @ m) / (s + sig2))


def _row(x: np.ndarray, ref: np.ndarray) -> Metric:
    """A checkpoint's CMMD as the worker records it (unnormalised: the truth above is for these embeddings)."""
    return Metric(step=0, extra=score("cmmd", torch.from_numpy(x), torch.from_numpy(ref), "sim", normalise=False))


def _simulate(shift: float, k: int, n: int, reps: int) -> tuple[float, float, float, float]:
    """(coverage, SE / true SD) of the report's CMMD effect over `reps` replicates, then the same without the
    reference's part. No seed noise: sample i of every arm and seed shares its prompt's draw z_i."""
    torch.set_num_threads(1)
    arm_mean = MU_CONTROL + shift * np.eye(D)[2]
    truth = -2000 * (_k(arm_mean - MU_REF, 2 * V) - _k(MU_CONTROL - MU_REF, 2 * V))  # equal spreads: only the cross
    rng = np.random.default_rng(62)
    hits, hits_without, estimates, ses, ses_without = 0, 0, [], [], []
    for _ in range(reps):
        ref = MU_REF + math.sqrt(V) * rng.standard_normal((n, D))  # a fresh reference draw each replicate
        z = rng.standard_normal((n, D))

        def draw(mean: np.ndarray, shared: np.ndarray) -> np.ndarray:
            return mean + math.sqrt(V) * (math.sqrt(RHO) * shared + math.sqrt(1 - RHO) * rng.standard_normal((n, D)))

        per_seed = [difference(_row(draw(arm_mean, z), ref), _row(draw(MU_CONTROL, z), ref), "cmmd")
                    for _ in range(k)]  # fmt: skip
        effect = across_seeds(per_seed)  # type: ignore[arg-type]
        without = across_seeds([replace(d, reference=None) for d in per_seed])  # type: ignore[arg-type, misc]
        assert effect is not None and effect.low is not None and effect.high is not None and effect.se is not None
        assert without is not None and without.low is not None and without.high is not None
        hits += effect.low <= truth <= effect.high
        hits_without += without.low <= truth <= without.high
        estimates.append(effect.diff)
        ses.append(effect.se)
        ses_without.append(without.se)
    sd = float(np.std(estimates, ddof=1))
    return (hits / reps, math.sqrt(float(np.mean(np.square(ses)))) / sd, hits_without / reps,
            math.sqrt(float(np.mean(np.square(ses_without)))) / sd)  # fmt: skip


def test_where_arms_differ_the_reference_images_part_restores_coverage() -> None:
    """8 seeds, no seed noise, arms plainly apart: per-sample values alone covered 91.5% (SE 0.82 of the true SD)."""
    cover, ratio, cover_without, ratio_without = _simulate(shift=0.1, k=8, n=60, reps=400)
    assert 0.93 <= cover <= 0.975, (cover, ratio)
    assert 0.9 <= ratio <= 1.15, ratio
    assert cover_without < 0.925 and ratio_without < 0.85, (cover_without, ratio_without)  # what it mends


def test_at_the_null_the_reference_part_leaves_the_interval_as_it_was() -> None:
    cover, ratio, cover_without, ratio_without = _simulate(shift=0.0, k=8, n=60, reps=200)
    assert cover >= 0.93 and cover == pytest.approx(cover_without, abs=0.011)
    assert ratio == pytest.approx(ratio_without, rel=0.02)


N, R, STEP = 16, 24, 20


def test_the_report_says_its_cmmd_interval_covers_the_reference_images(database_url: str) -> None:
    rng = np.random.default_rng(3)
    ref_spread = rng.normal(0, 0.05, R)  # how each reference image tilts the difference: common to every seed
    with session_scope(database_url) as session:
        arms = [{"parent": "A", "name": name, "eval": {"distribution": {"metrics": ["cmmd"], "samples": N}}}
                for name in ("base", "worse")]  # fmt: skip
        grid = create_grid(session, GridCreate(name="reference noise", arms=arms, control="base", seeds=2))
        for run in grid.runs:
            shift = 0.5 if run.arm == "worse" else 0.0
            values = (1.0 + shift + rng.normal(0, 0.01, N)).tolist()
            refs = (1.0 + shift + (ref_spread if run.arm == "worse" else 0.0) + rng.normal(0, 0.001, R)).tolist()
            insert_metrics(session, run.id, [{"step": STEP, "cmmd": float(np.mean(values)), "cmmd_n": N,
                                              "cmmd_se": float(np.std(values, ddof=1) / N**0.5),
                                              "cmmd_extractor": "clip-vit-l-14-336", "cmmd_samples": values,
                                              "cmmd_per_reference": refs}])  # fmt: skip
            run.state = "completed"
        grid_id = grid.id
    with session_scope(database_url) as session:
        report = build_report(session, session.get(Grid, grid_id))
    effect = next(e for e in report.effects if (e.arm, e.metric, e.against) == ("worse", "cmmd", "control"))
    assert effect.interval == "crossed" and f"reference images (R={R})" in effect.noise
    assert effect.budget is not None and effect.budget.reference > 0.5  # the samples barely differ; the reference does
    assert "reference images" in effect.budget.words
    assert effect.se is not None and effect.se > 0.9 * float(np.std(ref_spread, ddof=1)) / math.sqrt(R)


def test_arms_on_different_seeds_add_the_reference_part_of_their_means_difference() -> None:
    """A deciding grid's control may hold more seeds than the arm: the unpaired reading takes each side's mean
    per reference image over its own seeds, and their difference's spread / R."""
    rng = np.random.default_rng(5)
    arm = rng.normal(1.5, 0.01, (3, N)).tolist()
    other = rng.normal(1.0, 0.01, (2, N)).tolist()
    tilt = rng.normal(0, 0.05, R)
    arm_refs = (1.5 + tilt + rng.normal(0, 0.001, (3, R))).tolist()
    other_refs = (1.0 + rng.normal(0, 0.001, (2, R))).tolist()
    with_refs = across_arms(arm, other, (arm_refs, other_refs))
    without = across_arms(arm, other)
    assert with_refs is not None and without is not None and with_refs.components is not None
    by_hand = np.mean(arm_refs, axis=0) - np.mean(other_refs, axis=0)
    assert with_refs.components.reference == pytest.approx(float(np.var(by_hand, ddof=1)) / R, rel=1e-9)
    assert with_refs.components.references == R and with_refs.se > 2 * without.se  # type: ignore[operator]
