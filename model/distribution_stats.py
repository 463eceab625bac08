"""Distribution metrics between generated and reference image embeddings, with per-sample values so a paired
arm - control difference enters the report's crossed seeds x images interval unchanged. Pure maths.

MMD² (CMMD, Jayasumana et al., CVPR 2024): the Gaussian RBF kernel k(a, b) = exp(-|a - b|² / (2 sigma²)) with
sigma = 10 on L2-normalised embeddings, times 1000. The paper's reference code computes the biased V-statistic
(every kernel mean includes its diagonal); here it is the unbiased U-statistic (Gretton et al. 2012, eq. 3):

    MMD²_u = mean_{i != j} k(x_i, x_j) + mean_{a != b} k(y_a, y_b) - 2 mean_{i, a} k(x_i, y_a)

Per-sample values: the gen-gen term pairs samples, so it does not split into per-sample parts. Each generated
sample's value is its jackknife pseudo-value given the reference set, c_i = n T - (n - 1) T_(-i) (Quenouille;
Efron & Stein 1981). Written out (g_i: sample i's mean kernel to the other generated samples, r_i: to the
reference, U_xx = mean_i g_i):

    c_i = U_xx + 2 (n - 1) / (n - 2) (g_i - U_xx) - 2 r_i + U_yy

mean_i c_i equals MMD²_u exactly, and var(c) / n is the jackknife variance, which Efron and Stein show is never
biased low in expectation. For two arms evaluated on the same prompts and noise (sample i of each from the same
ones), d_i = c_i(arm) - c_i(control) has mean exactly MMD²_u(arm) - MMD²_u(control) and U_yy cancels.

The reference's values: the per-sample values hold the reference set fixed, and its draw is shared by every
arm, seed and sample, so its noise cancels only near the null. Each reference image's pseudo-value given the
generated samples (h_a: image a's mean kernel to the other reference images, s_a: to the generated samples,
U_yy = mean_a h_a) is the same formula from the other side:

    rho_a = U_yy + 2 (m - 1) / (m - 2) (h_a - U_yy) - 2 s_a + U_xx

mean_a rho_a equals MMD²_u exactly too, and the two-sample jackknife variance is var(c) / n + var(rho) / m.
Between two arms on one reference set rho_a(arm) - rho_a(control) = Delta U_xx - 2 (s_a(arm) - s_a(control)):
the reference part of the difference's variance is its spread over a, / m. Without it, intervals of arms that
differ covered 91.5-93.7% at 5-8 seeds by simulation (bench/distribution_sim.py, the tests' model).

Why not CMMD's linear approximation: on unit vectors with sigma = 10, k ~= 1 - |a - b|² / 200, so
CMMD ~= 10 |mean(x) - mean(y)|² (the paper's "nearly linear"; 0.1% in a 768-d check); that is why CMMD barely
sees a change of covariance and is reported beside a covariance-aware metric, FD.

FD (Fréchet distance, Heusel et al. 2017; on DINOv2 features, Stein et al. 2023): the Gaussians fitted to the
two feature sets, |mu_g - mu_r|² + tr(S_g + S_r - 2 (S_g S_r)^(1/2)). The plug-in FD is biased upward at small
n (Chong & Forsyth 2020): tr(S_g)/n + tr(S_r)/m from the means plus a larger covariance part, and it depends
on the model, so two arms at the same n can swap order. Its SE and bias here come from a delete-a-group
jackknife that leaves out group g of the generated samples (sample i in group i % G, the same groups for every
arm, so a difference is paired) and group g of the reference together; the bias-corrected value
G FD - (G - 1) mean FD_(-g) removes the 1/n and 1/m parts of the bias. Deleting from the generated side alone
left the reference's bias, which does not cancel between arms of different covariance: the paired interval then
covered 86% (bench/distribution_sim.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

CMMD_SIGMA = 10.0  # Jayasumana et al.'s bandwidth on unit-norm CLIP embeddings
CMMD_SCALE = 1000.0  # their reporting scale
FD_GROUPS = 20  # jackknife groups for FD: 20 eigen-decompositions of d x d beside the full one
_CHUNK = 4096  # kernel rows per block: 4096 x 10000 float64 is 330 MB at most


def l2_normalise(x: Tensor) -> Tensor:
    """(n, d) embeddings -> unit rows, in float64 (CMMD's preprocessing)."""
    x = x.to(torch.float64)
    return x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)


def _kernel_sums(a: Tensor, b: Tensor, sigma: float) -> Tensor:
    """(len(a),): sum over the rows of b of k(a_i, b_j), computed in row blocks."""
    a, b = a.to(torch.float64), b.to(device=a.device, dtype=torch.float64)
    b_sq = (b * b).sum(dim=1)
    out = torch.empty(len(a), dtype=torch.float64, device=a.device)
    for start in range(0, len(a), _CHUNK):
        block = a[start : start + _CHUNK]
        dist = ((block * block).sum(dim=1, keepdim=True) + b_sq - 2 * block @ b.T).clamp_min(0)  # (B, m)
        out[start : start + _CHUNK] = torch.exp(-dist / (2 * sigma * sigma)).sum(dim=1)
    return out


@dataclass(frozen=True)
class Reference:
    """A reference set's embeddings and its own kernel mean: computed once per grid and extractor."""

    features: Tensor  # (m, d) float64, as the metric sees them (normalised for CMMD)
    within: float  # mean over a != b of k(y_a, y_b): the U-statistic's reference term
    sigma: float
    row_means: Tensor  # (m,) float64: each image's mean kernel to the other reference images (h_a)


def reference(features: Tensor, sigma: float = CMMD_SIGMA, normalise: bool = True) -> Reference:
    """The reference term of MMD²_u for `features` (m >= 3 rows), and each row's part of it."""
    y = l2_normalise(features) if normalise else features.to(torch.float64)
    m = len(y)
    if m < 3:
        raise ValueError(f"an MMD reference needs at least 3 embeddings (its per-image values), got {m}")
    rows = (_kernel_sums(y, y, sigma) - 1) / (m - 1)  # k(y, y) = 1 on the diagonal
    return Reference(y, float(rows.mean()), sigma, rows)


def mmd_contributions(gen: Tensor, ref: Reference, scale: float = CMMD_SCALE, normalise: bool = True) -> Tensor:
    """(n,) float64 per-sample values of scale x MMD²_u(gen, ref): jackknife pseudo-values given the reference
    (module docstring); their mean is the U-statistic exactly. n >= 3 generated embeddings."""
    x = l2_normalise(gen) if normalise else gen.to(torch.float64)
    n = len(x)
    if n < 3:
        raise ValueError(f"per-sample MMD values need at least 3 generated embeddings, got {n}")
    g = (_kernel_sums(x, x, ref.sigma) - 1) / (n - 1)  # mean kernel to the other samples (diagonal is 1)
    r = _kernel_sums(x, ref.features.to(x.device), ref.sigma) / len(ref.features)
    u_xx = g.mean()
    return scale * (u_xx + 2 * (n - 1) / (n - 2) * (g - u_xx) - 2 * r + ref.within)


def mmd_reference_contributions(gen: Tensor, ref: Reference, scale: float = CMMD_SCALE,
                                normalise: bool = True) -> Tensor:  # fmt: skip
    """(m,) float64 per-reference-image values of scale x MMD²_u(gen, ref): jackknife pseudo-values given the
    generated samples (module docstring); their mean is the U-statistic exactly. n >= 2 generated embeddings."""
    x = l2_normalise(gen) if normalise else gen.to(torch.float64)
    n, m = len(x), len(ref.features)
    if n < 2:
        raise ValueError(f"per-reference MMD values need at least 2 generated embeddings, got {n}")
    u_xx = (float(_kernel_sums(x, x, ref.sigma).sum()) - n) / (n * (n - 1))
    s = _kernel_sums(ref.features.to(x.device), x, ref.sigma) / n  # each reference image's mean kernel to the samples
    h = ref.row_means.to(x.device)
    return scale * (ref.within + 2 * (m - 1) / (m - 2) * (h - ref.within) - 2 * s + u_xx)


def grouped_means(values: Tensor, most: int) -> Tensor:
    """`values` as they are where there are at most `most`, else the means of `most` groups (value a in group
    a % most: sizes differ by one at most), so a record's list stays bounded; the spread of the group means
    over their count estimates the same variance of the mean (to the groups' unequal sizes)."""
    if len(values) <= most:
        return values
    groups = torch.arange(len(values), device=values.device) % most
    total = torch.zeros(most, dtype=values.dtype, device=values.device).index_add_(0, groups, values)
    return total / torch.bincount(groups, minlength=most).to(values.dtype)


def mmd2(gen: Tensor, ref: Tensor, sigma: float = CMMD_SIGMA, scale: float = CMMD_SCALE, unbiased: bool = True,
         normalise: bool = True) -> float:  # fmt: skip
    """scale x MMD²: the U-statistic, or with unbiased=False the V-statistic the CMMD reference code computes."""
    x = l2_normalise(gen) if normalise else gen.to(torch.float64)
    y = l2_normalise(ref) if normalise else ref.to(torch.float64)
    n, m = len(x), len(y)
    xx, yy = float(_kernel_sums(x, x, sigma).sum()), float(_kernel_sums(y, y, sigma).sum())
    xy = float(_kernel_sums(x, y, sigma).sum()) / (n * m)
    if unbiased:
        return scale * ((xx - n) / (n * (n - 1)) + (yy - m) / (m * (m - 1)) - 2 * xy)
    return scale * (xx / (n * n) + yy / (m * m) - 2 * xy)


# -- Fréchet distance ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GaussianFit:
    """A feature set's mean and covariance (ddof 1), and the covariance's symmetric square root."""

    mean: np.ndarray  # (d,)
    cov: np.ndarray  # (d, d)
    sqrt_cov: np.ndarray  # (d, d), S^(1/2): computed once for a reference, so each FD is one eigh
    count: int


def _sym_sqrt(s: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh((s + s.T) / 2)
    return (v * np.sqrt(np.clip(w, 0, None))) @ v.T


def _cov(total: np.ndarray, outer: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    mean = total / count
    return mean, (outer - count * np.outer(mean, mean)) / (count - 1)


def gaussian_fit(features: Tensor | np.ndarray) -> GaussianFit:
    """The Gaussian fitted to (n, d) features, n >= 2."""
    f = np.asarray(features.detach().cpu() if isinstance(features, Tensor) else features, dtype=np.float64)
    if f.ndim != 2 or len(f) < 2:
        raise ValueError(f"a Gaussian fit needs (n >= 2, d) features, got shape {f.shape}")
    mean, cov = _cov(f.sum(axis=0), f.T @ f, len(f))
    return GaussianFit(mean, cov, _sym_sqrt(cov), len(f))


def _fd(mean: np.ndarray, cov: np.ndarray, ref: GaussianFit) -> float:
    # tr (S_g S_r)^(1/2) = tr (S_r^(1/2) S_g S_r^(1/2))^(1/2): a symmetric PSD matrix's eigenvalues, stable
    inner = ref.sqrt_cov @ cov @ ref.sqrt_cov
    cross = float(np.sqrt(np.clip(np.linalg.eigvalsh((inner + inner.T) / 2), 0, None)).sum())
    diff = mean - ref.mean
    return float(diff @ diff + np.trace(cov) + np.trace(ref.cov) - 2 * cross)


def frechet_distance(gen: GaussianFit, ref: GaussianFit) -> float:
    return _fd(gen.mean, gen.cov, ref)


@dataclass(frozen=True)
class FrechetEstimate:
    """FD of generated features against a reference, with its delete-a-group jackknife."""

    value: float  # the plug-in FD, as the field reports it
    corrected: float  # G FD - (G - 1) mean FD_(-g): the 1/n and 1/m parts of the bias removed
    bias: float  # value - corrected: the jackknife's estimate of the plug-in's small-n bias
    se: float  # the jackknife SE of the plug-in value
    pseudo: tuple[float, ...]  # the G group pseudo-values; their mean is `corrected`
    n: int


def _left_out(features: np.ndarray, groups: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(mean, cov) of `features` without group g (row i in group i % G), for each g, from running sums."""
    n, total, outer = len(features), features.sum(axis=0), features.T @ features
    parts = (features[g::groups] for g in range(groups))
    return [_cov(total - p.sum(axis=0), outer - p.T @ p, n - len(p)) for p in parts]


@dataclass(frozen=True)
class FrechetReference:
    """A reference set's Gaussian fit, and its fit without each jackknife group: computed once per grid."""

    full: GaussianFit
    left: tuple[GaussianFit, ...]  # without reference group g (row a in group a % G)


def _as_array(x: Tensor | np.ndarray) -> np.ndarray:
    return np.asarray(x.detach().cpu() if isinstance(x, Tensor) else x, dtype=np.float64)


def frechet_reference(features: Tensor | np.ndarray, groups: int = FD_GROUPS) -> FrechetReference:
    """The reference for FD with `groups` jackknife groups (FD_GROUPS; fewer, samples // 2, for under 40 samples)."""
    f = _as_array(features)
    if groups < 2 or len(f) < 2 * groups:
        raise ValueError(f"FD's jackknife over {groups} groups needs at least {2 * groups} reference images")
    left = tuple(GaussianFit(m, c, _sym_sqrt(c), len(f)) for m, c in _left_out(f, groups))
    return FrechetReference(gaussian_fit(f), left)


def fd_jackknife(gen: Tensor | np.ndarray, ref: FrechetReference) -> FrechetEstimate:
    """FD of (n, d) generated features against `ref`, with its jackknife over the reference's G groups (group g
    of the samples left out with group g of the reference)."""
    f, groups = _as_array(gen), len(ref.left)
    if len(f) < 2 * groups:
        raise ValueError(f"FD's jackknife over {groups} groups needs at least {2 * groups} samples, got {len(f)}")
    full = _fd(*_cov(f.sum(axis=0), f.T @ f, len(f)), ref.full)
    left = np.array([_fd(m, c, r) for (m, c), r in zip(_left_out(f, groups), ref.left, strict=True)])
    pseudo = groups * full - (groups - 1) * left
    corrected = float(pseudo.mean())
    se = math.sqrt(float(pseudo.var(ddof=1)) / groups)
    return FrechetEstimate(full, corrected, full - corrected, se, tuple(float(p) for p in pseudo), len(f))


@dataclass(frozen=True)
class FrechetDifference:
    """FD(arm) - FD(control) on the same prompts and noise, with the paired jackknife over the same groups."""

    value: float  # plug-in difference
    corrected: float  # difference of the bias-corrected values
    se: float  # the jackknife SE of the difference (paired group by group)
    pseudo: tuple[float, ...]  # per-group pseudo-value differences: a row of the crossed seeds x groups table


def fd_difference(arm: FrechetEstimate, control: FrechetEstimate) -> FrechetDifference:
    """The paired difference of two jackknifed FDs over the same groups (sample i of each from the same noise)."""
    if len(arm.pseudo) != len(control.pseudo) or arm.n != control.n:
        raise ValueError("a paired FD difference needs both arms on the same samples and jackknife groups")
    d = np.array(arm.pseudo) - np.array(control.pseudo)
    se = math.sqrt(float(d.var(ddof=1)) / len(d))
    return FrechetDifference(arm.value - control.value, float(d.mean()), se, tuple(float(x) for x in d))
