"""CMMD's U-statistic and its per-sample values, FD and its jackknife (model/distribution_stats.py): exact
identities against brute force, and the estimator's unbiasedness checked against a known truth."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import torch

from model.distribution_stats import (
    fd_difference,
    fd_jackknife,
    frechet_distance,
    frechet_reference,
    gaussian_fit,
    grouped_means,
    l2_normalise,
    mmd2,
    mmd_contributions,
    mmd_reference_contributions,
    reference,
)


def _brute_mmd2(x: torch.Tensor, y: torch.Tensor, unbiased: bool) -> float:
    """1000 x MMD² written out pair by pair on normalised rows, sigma 10."""
    x, y = l2_normalise(x), l2_normalise(y)

    def k(a: torch.Tensor, b: torch.Tensor) -> float:
        return math.exp(-float(((a - b) ** 2).sum()) / 200)

    n, m = len(x), len(y)
    xx = [k(x[i], x[j]) for i in range(n) for j in range(n) if i != j or not unbiased]
    yy = [k(y[a], y[b]) for a in range(m) for b in range(m) if a != b or not unbiased]
    xy = [k(x[i], y[a]) for i in range(n) for a in range(m)]
    return 1000 * (sum(xx) / len(xx) + sum(yy) / len(yy) - 2 * sum(xy) / len(xy))


def test_mmd2_is_the_u_statistic_and_the_v_statistic_the_reference_codes():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 5, generator=gen) + 0.4, torch.randn(15, 5, generator=gen)
    assert mmd2(x, y) == pytest.approx(_brute_mmd2(x, y, unbiased=True), rel=1e-9)
    assert mmd2(x, y, unbiased=False) == pytest.approx(_brute_mmd2(x, y, unbiased=False), rel=1e-9)
    assert mmd2(x, y, unbiased=False) > mmd2(x, y)  # the V-statistic's diagonal adds 1/n and 1/m


def test_per_sample_values_are_jackknife_pseudo_values_whose_mean_is_the_u_statistic():
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(20, 6, generator=gen) + 0.3, torch.randn(25, 6, generator=gen)
    values = mmd_contributions(x, reference(y))
    n, whole = len(x), mmd2(x, y)
    assert float(values.mean()) == pytest.approx(whole, rel=1e-10)
    for i in (0, 7, 19):
        left_out = mmd2(torch.cat([x[:i], x[i + 1 :]]), y)
        assert float(values[i]) == pytest.approx(n * whole - (n - 1) * left_out, rel=1e-8, abs=1e-9)


def test_per_reference_values_are_the_reference_sides_pseudo_values_whose_mean_is_the_u_statistic():
    gen = torch.Generator().manual_seed(11)
    x, y = torch.randn(14, 6, generator=gen) + 0.3, torch.randn(21, 6, generator=gen)
    values = mmd_reference_contributions(x, reference(y))
    m, whole = len(y), mmd2(x, y)
    assert len(values) == m and float(values.mean()) == pytest.approx(whole, rel=1e-10)
    for a in (0, 9, 20):
        left_out = mmd2(x, torch.cat([y[:a], y[a + 1 :]]))
        assert float(values[a]) == pytest.approx(m * whole - (m - 1) * left_out, rel=1e-8, abs=1e-9)


def test_grouped_means_bound_the_list_and_keep_the_mean_of_equal_groups():
    values = torch.arange(12, dtype=torch.float64)
    assert torch.equal(grouped_means(values, 12), values)
    grouped = grouped_means(values, 4)  # value a in group a % 4: (0, 4, 8), (1, 5, 9), ...
    assert grouped.tolist() == [4.0, 5.0, 6.0, 7.0] and float(grouped.mean()) == float(values.mean())


def test_a_paired_difference_of_per_sample_values_is_the_difference_of_the_statistics():
    gen = torch.Generator().manual_seed(2)
    y = torch.randn(30, 8, generator=gen)
    arm, control = torch.randn(16, 8, generator=gen) + 0.5, torch.randn(16, 8, generator=gen)
    ref = reference(y)
    d = mmd_contributions(arm, ref) - mmd_contributions(control, ref)
    assert float(d.mean()) == pytest.approx(mmd2(arm, y) - mmd2(control, y), rel=1e-10)


def test_cmmd_is_nearly_linear_on_unit_vectors():
    """Why CMMD barely sees covariance: CMMD ~= 10 |mean(x) - mean(y)|² (within 1% on isotropic 768-d rows)."""
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(400, 768, generator=gen) + 0.05, torch.randn(400, 768, generator=gen)
    xn, yn = l2_normalise(x), l2_normalise(y)
    linear = 10 * float(((xn.mean(0) - yn.mean(0)) ** 2).sum())
    assert mmd2(x, y, unbiased=False) == pytest.approx(linear, rel=1e-2)


def test_the_u_statistic_is_unbiased_under_the_null_and_the_v_statistic_is_not():
    rng = torch.Generator().manual_seed(4)
    u, v = [], []
    for _ in range(300):
        x, y = torch.randn(30, 4, generator=rng), torch.randn(30, 4, generator=rng)
        u.append(mmd2(x, y))
        v.append(mmd2(x, y, unbiased=False))
    se = float(np.std(u, ddof=1)) / math.sqrt(len(u))
    assert abs(float(np.mean(u))) < 3 * se
    assert float(np.mean(v)) > float(np.mean(u)) + 10 * se


def test_frechet_distance_matches_scipy_sqrtm():
    rng = np.random.default_rng(5)
    a, b = rng.normal(0.2, 1.3, (300, 7)), rng.normal(0, 1, (400, 7))
    fa, fb = gaussian_fit(a), gaussian_fit(b)
    root = scipy.linalg.sqrtm(fa.cov @ fb.cov).real
    expected = float(((fa.mean - fb.mean) ** 2).sum() + np.trace(fa.cov + fb.cov - 2 * root))
    assert frechet_distance(fa, fb) == pytest.approx(expected, rel=1e-9)


def test_fd_jackknife_removes_the_small_n_bias_the_plug_in_carries():
    """Generated and reference from one distribution (FD 0), both small: the plug-in is biased up (the means'
    part alone tr(S)(1/n + 1/m)); the jackknife-corrected value is much nearer 0 and says how large the bias is."""
    rng = np.random.default_rng(6)
    plug, corrected, bias = [], [], []
    for _ in range(60):
        ref = frechet_reference(rng.normal(0, 1, (100, 8)))
        est = fd_jackknife(rng.normal(0, 1, (100, 8)), ref)
        plug.append(est.value)
        corrected.append(est.corrected)
        bias.append(est.bias)
        assert est.se > 0 and len(est.pseudo) == 20
    assert np.mean(plug) > 0.16  # tr(I_8)(1/100 + 1/100) alone
    assert abs(np.mean(corrected)) < 0.2 * np.mean(plug)
    assert np.mean(bias) == pytest.approx(np.mean(plug) - np.mean(corrected), rel=1e-9)


def test_fd_difference_is_paired_over_the_same_groups():
    rng = np.random.default_rng(7)
    ref = frechet_reference(rng.normal(0, 1, (500, 5)))
    shared = rng.normal(0, 1, (200, 5))  # the same prompts and noise for both arms
    arm = fd_jackknife(shared * 1.5 + 0.1 * rng.normal(0, 1, (200, 5)), ref)
    control = fd_jackknife(shared + 0.1 * rng.normal(0, 1, (200, 5)), ref)
    diff = fd_difference(arm, control)
    assert diff.value == pytest.approx(arm.value - control.value)
    assert diff.corrected == pytest.approx(arm.corrected - control.corrected)
    assert diff.se < math.hypot(arm.se, control.se)  # pairing removes the shared noise
    with pytest.raises(ValueError, match="same samples"):
        fd_difference(arm, fd_jackknife(shared[:100], ref))


def test_too_few_samples_is_an_error_that_says_so():
    with pytest.raises(ValueError, match="at least 3"):
        mmd_contributions(torch.randn(2, 4), reference(torch.randn(5, 4)))
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="at least 40 reference images"):
        frechet_reference(rng.normal(size=(30, 4)))
    ref = frechet_reference(rng.normal(size=(64, 4)))
    with pytest.raises(ValueError, match="at least 40 samples, got 30"):
        fd_jackknife(rng.normal(size=(30, 4)), ref)
    small = frechet_reference(rng.normal(size=(64, 4)), groups=16)  # 32 samples: 16 groups
    assert len(fd_jackknife(rng.normal(size=(32, 4)), small).pseudo) == 16


def test_the_per_sample_values_carry_the_noise_of_a_paired_difference():
    """Known truth by simulation: two arms on shared per-sample noise, the reference fixed. The SE the per-sample
    differences give, sd(d)/sqrt(n), matches the true SD of the estimated difference over replicates; and that
    SD is far below the two arms' SEs combined, which is why pairing matters."""
    gen = torch.Generator().manual_seed(8)
    d, n = 16, 80
    ref = reference(torch.randn(200, d, generator=gen) * 0.2 + torch.eye(d)[0], normalise=False)
    shift = 0.15 * torch.eye(d)[1]
    estimates, ses, unpaired = [], [], []
    for _ in range(250):
        shared = torch.randn(n, d, generator=gen) * 0.2  # the same prompt and noise for sample i of both arms
        arm = torch.eye(d)[0] + shift + shared + 0.1 * torch.randn(n, d, generator=gen)
        control = torch.eye(d)[0] + 0.5 * shift + shared + 0.1 * torch.randn(n, d, generator=gen)
        ca, cc = mmd_contributions(arm, ref, normalise=False), mmd_contributions(control, ref, normalise=False)
        diff = ca - cc
        estimates.append(float(diff.mean()))
        ses.append(float(diff.std()) / math.sqrt(n))
        unpaired.append(math.hypot(float(ca.std()), float(cc.std())) / math.sqrt(n))
    true_sd = float(np.std(estimates, ddof=1))
    rms_se = math.sqrt(float(np.mean(np.square(ses))))
    assert 0.85 < rms_se / true_sd < 1.25
    assert float(np.mean(unpaired)) > 1.4 * true_sd
