"""Do CMMD's and FD's paired arm - control intervals cover? Embeddings drawn from known distributions, read by
the product's own code against the exact truth: CMMD as a worker records it (model/distribution_pass.py `score`:
the per-sample and per-reference values) and as the report reads it (orchestrator/results/reports/stats.py
`difference` per seed, `across_seeds` across them: the crossed seeds x images interval with the reference
images' part); FD by its jackknife groups through the crossed interval. Beside the report's CMMD interval, the
same without the reference's part (the reading before it, "without ref").

The model (d-dimensional, diagonal covariances): sample i of seed s of arm a is
    x = mu_a + u_{a,s} + sqrt(v_a) * (sqrt(RHO) z_i + sqrt(ARM_PROMPT) q_{a,i} + sqrt(1 - RHO - ARM_PROMPT) e_{a,s,i})
with z_i shared by every arm and seed (the same prompt and noise for sample i), q_{a,i} the arm's own way with
prompt i (shared by its seeds: what makes the paired difference vary by prompt), u_{a,s} a seed's offset
(N(0, TAU^2), half of it shared by the arms' seed s: the same data order), e independent. The reference set is
drawn anew each replicate from N(mu_ref, v_ref), as many as the samples. Embeddings are Gaussian with norms near
1 and are not renormalised, so the kernel's expectations have closed forms (the truth below is exact); the
estimator's normalisation step is the same for any input and is not what is tested.

Truth, over seeds (the estimand the crossed interval's grand mean stands for):
    MMD²(a) = 1000 [K(0, 2 v_a) + K(0, 2 v_ref) - 2 K(mu_a - mu_ref, v_a + TAU^2 + v_ref)]
    K(m, s) = E exp(-|delta|^2 / (2 sigma^2)) for delta ~ N(m, diag s)
            = prod (1 + s/sigma^2)^(-1/2) exp(-1/2 sum m^2/(s + sigma^2))
    FD(a)   = |mu_a - mu_ref|^2 + d TAU^2 + sum (sqrt(v_a) - sqrt(v_ref))^2

Scenarios against the control: the same distribution (null), a mean shift, a large mean shift (where the
reference draw's part of the difference is large enough to matter: it grows with the squared shift), and a
covariance change with the same trace (lost diversity in half the directions) that CMMD barely sees and FD
catches.

    python bench/distribution_sim.py            # 2000 replicates a cell, more cells
    python bench/distribution_sim.py --quick    # 600 a cell at k = 3, n = 500: about 4 minutes on 2 idle cores
    python bench/distribution_sim.py --reps 1200 --cell 4:500   # one cell (a process per cell runs them in parallel)
    python bench/distribution_sim.py --tau 0 --cell 5:500 --cell 8:500 --scenario null --scenario "large shift"

The last line reads `cmmd coverage C (lowest over the cells with n >= 500, k >= 3; highest H) ...`.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from model.distribution_pass import score
from model.distribution_stats import CMMD_SCALE, CMMD_SIGMA, fd_difference, fd_jackknife, frechet_reference, mmd2
from orchestrator.db.models import Metric
from orchestrator.results.reports.crossed import crossed_interval
from orchestrator.results.reports.stats import across_seeds, difference, t_quantile

D = 64
RHO = 0.5  # share of a sample's spread fixed by its prompt and noise (common to every arm and seed)
ARM_PROMPT = 0.2  # share fixed by the arm's handling of that prompt (common to the arm's seeds, not the arms')
# A seed's mean offset SD per coordinate. 0.001: seeds a few % of the paired difference's variance at n = 500, so
# the interval rests on the per-sample values; --tau 0.004: about a quarter; 0.012: seeds dominant.
TAU = 0.001
TAU_DOMINANT = 0.012
SEED_SHARED = 0.5  # share of the seed offset's variance common to seed s of every arm
MU_REF = np.zeros(D)
MU_REF[0] = 0.7
V_REF = np.full(D, 0.51 / D)  # E|y|^2 = 1
MU_CONTROL = MU_REF.copy()
MU_CONTROL[1] = 0.3  # the control is not the reference either: CMMD about 0.9, as generators score


@dataclass(frozen=True)
class Arm:
    mean: np.ndarray
    var: np.ndarray


CONTROL = Arm(MU_CONTROL, V_REF)
_shift = MU_CONTROL.copy()
_shift[2] = 0.03
_far = MU_CONTROL.copy()
_far[2] = 0.1  # arms that differ plainly: the reference images' part of the paired difference is about a sixth
_narrow = V_REF.copy()
_narrow[: D // 2] *= 1.8
_narrow[D // 2 :] *= 0.2
SCENARIOS = {"null": CONTROL, "mean shift": Arm(_shift, V_REF), "large shift": Arm(_far, V_REF),
             "covariance": Arm(MU_CONTROL, _narrow)}


def _k(m: np.ndarray, s: np.ndarray) -> float:
    sig2 = CMMD_SIGMA**2
    return float(np.prod((1 + s / sig2) ** -0.5) * math.exp(-0.5 * float(np.sum(m * m / (s + sig2)))))


def true_mmd(arm: Arm, tau: float) -> float:
    cross = _k(arm.mean - MU_REF, arm.var + tau**2 + V_REF)
    return CMMD_SCALE * (_k(np.zeros(D), 2 * arm.var) + _k(np.zeros(D), 2 * V_REF) - 2 * cross)


def true_fd(arm: Arm, tau: float) -> float:
    return float(np.sum((arm.mean - MU_REF) ** 2) + D * tau**2 + np.sum((np.sqrt(arm.var) - np.sqrt(V_REF)) ** 2))


def draw_seeds(rng: np.random.Generator, arms: list[Arm], k: int, n: int, tau: float) -> list[list[np.ndarray]]:
    """[arm][seed] -> (n, D) embeddings, sample i of every arm and seed sharing z_i."""
    z = rng.standard_normal((n, D))
    shared = rng.standard_normal((k, D))
    noise = math.sqrt(1 - RHO - ARM_PROMPT)
    out = []
    for arm in arms:
        prompt = math.sqrt(ARM_PROMPT) * rng.standard_normal((n, D))
        rows = []
        for s in range(k):
            u = tau * (math.sqrt(SEED_SHARED) * shared[s] + math.sqrt(1 - SEED_SHARED) * rng.standard_normal(D))
            w = math.sqrt(RHO) * z + prompt + noise * rng.standard_normal((n, D))
            rows.append(arm.mean + u + np.sqrt(arm.var) * w)
        out.append(rows)
    return out


@dataclass
class Cell:
    cmmd_hits: int = 0
    cmmd_hits_without: int = 0  # the same interval without the reference's part
    fd_hits: int = 0
    fd_counted: int = 0
    cmmd_estimates: list[float] | None = None
    seed_share: float = 0.0
    reference_share: float = 0.0  # the reference images' share of the CMMD effect's variance (median)
    se_over_sd: float = 0.0  # the intervals' RMS SE over the estimates' SD: 1 where the interval's noise is right
    se_over_sd_without: float = 0.0
    df: float = 0.0  # the intervals' median df (crossed.py's Satterthwaite, the seed mean square at its bound)


def recorded(features: np.ndarray, ref_x: np.ndarray) -> Metric:
    """One checkpoint's CMMD as a worker records it (distribution_pass.score), held as the report reads a row."""
    fields = score("cmmd", torch.from_numpy(features), torch.from_numpy(ref_x), "simulated", normalise=False)
    return Metric(step=0, extra=fields)


def cell(rng: np.random.Generator, arm: Arm, k: int, n: int, reps: int, tau: float, fd: bool = True) -> Cell:
    """Coverage of the report's interval of arm - control over `reps` replicates (CMMD per sample and per
    reference image; FD per group)."""
    truth_mmd, truth_fd = true_mmd(arm, tau) - true_mmd(CONTROL, tau), true_fd(arm, tau) - true_fd(CONTROL, tau)
    out = Cell(cmmd_estimates=[])
    shares, ref_shares, ses, ses_without, dfs = [], [], [], [], []
    for _ in range(reps):
        ref_x = MU_REF + np.sqrt(V_REF) * rng.standard_normal((n, D))
        ref_fit = frechet_reference(ref_x) if fd else None
        (arm_rows, control_rows) = draw_seeds(rng, [arm, CONTROL], k, n, tau)
        per_seed, fd_table = [], []
        for a, c in zip(arm_rows, control_rows, strict=True):
            per_seed.append(difference(recorded(a, ref_x), recorded(c, ref_x), "cmmd"))
            if fd:
                fd_table.append(list(fd_difference(fd_jackknife(a, ref_fit), fd_jackknife(c, ref_fit)).pseudo))
        got = across_seeds(per_seed)  # type: ignore[arg-type]
        without = across_seeds([replace(d, reference=None) for d in per_seed])  # type: ignore[arg-type]
        assert got is not None and got.components is not None and got.low is not None and got.high is not None
        assert without is not None and without.low is not None and without.high is not None
        out.cmmd_hits += got.low <= truth_mmd <= got.high
        out.cmmd_hits_without += without.low <= truth_mmd <= without.high
        out.cmmd_estimates.append(got.diff)
        shares.append(got.components.shares()[0])
        ref_shares.append(got.components.reference_share())
        ses.append(got.se)
        ses_without.append(without.se)
        dfs.append(got.df if got.df is not None else math.inf)
        fd_got = crossed_interval(fd_table, t_quantile) if fd else None
        if fd_got is not None:
            out.fd_counted += 1
            out.fd_hits += fd_got.low <= truth_fd <= fd_got.high
    out.seed_share = float(np.median(shares))
    out.reference_share = float(np.median(ref_shares))
    sd = float(np.std(out.cmmd_estimates, ddof=1))
    out.se_over_sd = math.sqrt(float(np.mean(np.square(ses)))) / sd
    out.se_over_sd_without = math.sqrt(float(np.mean(np.square(ses_without)))) / sd
    out.df = float(np.median(dfs))
    return out


def bias_table(rng: np.random.Generator, ns: tuple[int, ...], reps: int) -> None:
    """Generated = reference distribution (truth 0): CMMD's U- and V-statistic, FD plug-in and jackknifed."""
    print("\nBias against n, generated drawn from the reference distribution (truth 0 for both metrics):")
    print("| n | CMMD U-stat (±SE) | CMMD V-stat (reference code) | FD plug-in | FD jackknife-corrected (±SE) |")
    print("|---|---|---|---|---|")
    for n in ns:
        u, v, fd, fdc = [], [], [], []
        for _ in range(reps):
            x = MU_REF + np.sqrt(V_REF) * rng.standard_normal((n, D))
            y = MU_REF + np.sqrt(V_REF) * rng.standard_normal((n, D))
            tx, ty = torch.from_numpy(x), torch.from_numpy(y)
            u.append(mmd2(tx, ty, normalise=False))
            v.append(mmd2(tx, ty, unbiased=False, normalise=False))
            est = fd_jackknife(x, frechet_reference(y))
            fd.append(est.value)
            fdc.append(est.corrected)

        def se(xs: list[float]) -> float:
            return float(np.std(xs, ddof=1) / math.sqrt(len(xs)))

        print(f"| {n} | {np.mean(u):.5f} ± {se(u):.5f} | {np.mean(v):.4f} | {np.mean(fd):.4f} "
              f"| {np.mean(fdc):.4f} ± {se(fdc):.4f} |", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="600 replicates of k = 3, n = 500 per scenario")
    ap.add_argument("--reps", type=int, help="replicates a cell (overrides --quick)")
    ap.add_argument("--tau", type=float, default=TAU, help=f"a seed's offset SD ({TAU_DOMINANT}: seeds dominant)")
    ap.add_argument("--cell", action="append", metavar="K:N", help="only these cells (seeds:samples), e.g. 4:500")
    ap.add_argument("--bias-reps", type=int, help="replicates of the bias table's rows (0: no table)")
    ap.add_argument("--scenario", action="append", choices=list(SCENARIOS), help="only these scenarios")
    ap.add_argument("--no-fd", action="store_true", help="CMMD only (FD's jackknife is most of a replicate's time)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    reps = args.reps or (600 if args.quick else 2000)
    cells = [(3, 500)] if args.quick else [(2, 100), (3, 100), (3, 500), (4, 500), (5, 500), (8, 500), (3, 2000)]
    scenarios = {name: SCENARIOS[name] for name in args.scenario or SCENARIOS}
    if args.cell:
        cells = [(int(k), int(n)) for k, n in (c.split(":") for c in args.cell)]
    rng = np.random.default_rng(58)
    print(f"{reps} replicates a cell, d = {D}, seed offset SD {args.tau}, reference set as large as the samples, "
          "95% nominal")
    for name, arm in SCENARIOS.items():
        print(f"truth {name}: CMMD {true_mmd(arm, args.tau) - true_mmd(CONTROL, args.tau):+.5f}, "
              f"FD {true_fd(arm, args.tau) - true_fd(CONTROL, args.tau):+.5f}")
    print("| scenario | k | n | CMMD coverage | without ref | CMMD SE / SD | without ref | median df | seed share "
          "(median) | reference share (median) | FD coverage |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    start = time.monotonic()
    low, high, null_mean, null_se = 1.0, 0.0, math.nan, math.nan
    for name, arm in scenarios.items():
        for k, n in cells:
            got = cell(rng, arm, k, n, reps, args.tau, fd=not args.no_fd)
            cover = got.cmmd_hits / reps
            if n >= 500 and k >= 3:
                low, high = min(low, cover), max(high, cover)
                if name == "null":
                    est = got.cmmd_estimates or []
                    null_mean, null_se = float(np.mean(est)), float(np.std(est, ddof=1) / math.sqrt(len(est)))
            fd_cover = got.fd_hits / got.fd_counted if got.fd_counted else math.nan
            print(f"| {name} | {k} | {n} | {cover:.3f} | {got.cmmd_hits_without / reps:.3f} | {got.se_over_sd:.2f} "
                  f"| {got.se_over_sd_without:.2f} | {got.df:.1f} | {got.seed_share:.0%} | {got.reference_share:.0%} "
                  f"| {fd_cover:.3f} |", flush=True)  # fmt: skip
    bias_reps = args.bias_reps if args.bias_reps is not None else (100 if args.quick else 300)
    if bias_reps:
        bias_table(rng, (100, 500) if args.quick else (50, 100, 500, 2000), bias_reps)
    print(f"({time.monotonic() - start:.0f} s)")
    null = (f"null mean of the paired difference {null_mean:+.5f} ± {null_se:.5f} (within 2 SE of 0: "
            f"{abs(null_mean) <= 2 * null_se})" if math.isfinite(null_mean) else "no null cell run")
    print(f"cmmd coverage {low:.3f} (lowest over the cells with n >= 500, k >= 3; highest {high:.3f}); {null}")


if __name__ == "__main__":
    main()
