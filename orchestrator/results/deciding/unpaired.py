"""A comparison's seeds read unpaired where the grid's seeds share no effect: twice the degrees of freedom.

Why: the report reads a comparison as a seeds x images table of paired differences (seed s of one arm minus
seed s of the other), so its seed part rests on k - 1 df: at 2 and 3 seeds a look reads t on 1 or 2 df and
decides almost nothing where seeds matter (bench/decide_sim.py, issue 62). Pairing pays where seed s of
every arm shares an effect (the same initialisation and data order: on a GPU at tiny size the per-seed
differences spread 13x less than the arms' own seeds summed), since the shared part cancels in the
difference. Where the arms' seeds share nothing, each arm's own spread over its k seeds measures the same
seed variance on k - 1 df of its own, and the two summed rest on up to 2 (k - 1) df (Welch's two-sample
variance, on Satterthwaite's df).

Which one a look reads: a two-way analysis of the runs' values over the arms that ran every one of the
comparison's seeds (arms x seeds, additive): the seeds' mean square against the residual's, an F test of
"seed s moves every arm alike". Where it finds no shared effect (p at least SHARED_P) the comparison is read
unpaired, else paired, as before. Each reading is valid on its own: unpaired with a shared effect only
overstates the variance (the shared part counts twice instead of cancelling), so the test guards power. The
choice rests on the same runs, so its error rate is checked, not assumed: bench/decide_sim.py's null rates
stay within alpha + 2 SE with seeds that share nothing, that share the effect measured on a GPU, and with one
arm's seeds 3x wider (docs/benchmarks.md, issue 62); the chosen reading's 95% interval covers 93-97.5% with a
shared part of none, half and all of each arm's own (tests/orchestrator/results/deciding/test_unpaired.py).
Pure: numpy-free, scipy lazily.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.results.deciding.borrowed import SeedVariance, difference_of, run_spread, seed_se_df
from orchestrator.results.deciding.sequential import SEED_DF_QUANTILE, Variance

SHARED_P = 0.2  # the seeds' F test's p at and above which the seeds share no effect: read unpaired
# The least residual df the test may rest on: two arms on two seeds (1 df) cannot tell a shared effect from
# chance (F(1, 1) must pass 9.5 to be found at SHARED_P), and one missed costs the comparison power.
MIN_REST_DF = 3


@dataclass(frozen=True)
class SharedSeeds:
    """The F test of a seed effect common to every arm: the seeds' mean square over the arms x seeds
    residual's, on (seeds - 1, (arms - 1)(seeds - 1)) df, over `arms` arms."""

    f: float
    p: float
    df: tuple[int, int]
    arms: int

    def words(self) -> str:
        return f"F {self.f:.3g} on {self.df[0]}, {self.df[1]} df over {self.arms} arms, p {self.p:.2g}"


@dataclass(frozen=True)
class UnpairedReading:
    se: float
    df: float
    seeds: SeedVariance  # the difference's seed part (the two arms' spreads summed), as borrowed.py reads one
    test: SharedSeeds
    note: str


def shared_seed_test(runs: Mapping[str, Mapping[int, float]], seeds: Sequence[int]) -> SharedSeeds | None:
    """The F test over the arms whose runs hold a finite value at every one of `seeds` (each arm's values
    keyed by its seed); None under MIN_REST_DF residual df (two arms need four seeds, three arms three). A
    table with no residual spread reads as shared (p 0) where its seeds differ: nothing says they do not."""
    from scipy.stats import f as f_dist  # lazily: the API imports this module and must start fast

    rows = [[float(values[s]) for s in seeds] for values in runs.values()
            if all(s in values and math.isfinite(values[s]) for s in seeds)]  # fmt: skip
    a, k = len(rows), len(seeds)
    if a < 2 or k < 2 or (a - 1) * (k - 1) < MIN_REST_DF:
        return None
    arm_means = [sum(r) / k for r in rows]
    seed_means = [sum(r[j] for r in rows) / a for j in range(k)]
    grand = sum(arm_means) / a
    df_seed, df_rest = k - 1, (a - 1) * (k - 1)
    ms_seed = a * sum((m - grand) ** 2 for m in seed_means) / df_seed
    ms_rest = sum((rows[i][j] - arm_means[i] - seed_means[j] + grand) ** 2
                  for i in range(a) for j in range(k)) / df_rest  # fmt: skip
    if not ms_rest > 0:
        return SharedSeeds(math.inf if ms_seed > 0 else 0.0, 0.0, (df_seed, df_rest), a)
    f = ms_seed / ms_rest
    return SharedSeeds(f, float(f_dist.sf(f, df_seed, df_rest)), (df_seed, df_rest), a)


def unpaired_reading(runs: Mapping[str, Mapping[int, float]], arm: str, other: str, seeds: Sequence[int],
                     images: SeedVariance, df_quantile: float) -> UnpairedReading | None:  # fmt: skip
    """The comparison arm - other on `seeds` read unpaired where the grid's runs (`runs`: each arm's values
    by seed, at the comparison's images) show no shared seed effect; None where they do, where the test
    cannot be read, or where either arm lacks a seed. `images`: the comparison's images' and rest's part
    of the mean's variance (borrowed.py crossed_parts); the SE and df as borrowed.py reads a seed part."""
    a, b = runs.get(arm, {}), runs.get(other, {})
    if len(seeds) < 2 or any(s not in a or s not in b for s in seeds):
        return None
    test = shared_seed_test(runs, seeds)
    if test is None or test.p < SHARED_P:
        return None
    summed = difference_of(run_spread([a[s] for s in seeds]), run_spread([b[s] for s in seeds]))
    if summed is None or not summed.value > 0:
        return None
    se, df = seed_se_df(summed, images, len(seeds), df_quantile)
    note = (f"; seeds read unpaired (each arm's own spread, {summed.df:.3g} df): no seed effect shared "
            f"across arms ({test.words()})")  # fmt: skip
    return UnpairedReading(se, df, summed, test, note)


def unpaired_look(runs: Mapping[str, Mapping[int, float]], arm: str, other: str, k: int, n: int,
                  images: SeedVariance) -> tuple[UnpairedReading, Variance] | None:  # fmt: skip
    """A look's unpaired reading of arm - other (unpaired_reading) on the k seeds both arms ran, with the
    variance components that project it (the information fraction, the chooser) as a borrowed reading's
    are; None where the seeds both ran are not k, or where unpaired_reading gives none."""
    seeds = sorted(set(runs.get(arm, {})) & set(runs.get(other, {})))
    if len(seeds) != k:
        return None
    r = unpaired_reading(runs, arm, other, seeds, images, SEED_DF_QUANTILE)
    if r is None:
        return None
    return r, Variance(seed=r.seeds.value, image=images.value * n, rest=0.0)

