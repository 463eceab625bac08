"""Flow matching and AsymFlow: targets, exact velocity recovery, the sampler."""

from __future__ import annotations

import pytest
import torch

from model.flow import (
    FlowMatching,
    asymflow_velocity,
    estimate_pca_basis,
    euler_sample,
    interpolate,
    patchify,
    project,
    sample_t,
    unpatchify,
)
from model.spec import FlowSpec

PATCH = 4


def _data(n: int = 6, seed: int = 0) -> torch.Tensor:
    """Images with strong low-rank patch structure plus a little noise (float64 for exactness)."""
    g = torch.Generator().manual_seed(seed)
    smooth = torch.nn.functional.interpolate(torch.rand(n, 3, 4, 4, generator=g), size=16, mode="bilinear")
    return (smooth + 0.01 * torch.randn(n, 3, 16, 16, generator=g)).double()


def test_patchify_roundtrip() -> None:
    x = torch.randn(2, 3, 8, 12)
    p = patchify(x, PATCH)
    assert p.shape == (2, 6, 48)
    assert torch.equal(unpatchify(p, PATCH, 3, 8, 12), x)
    # patch 0 is the top-left 4x4 block, channel-major
    assert torch.equal(p[0, 0], x[0, :, :4, :4].reshape(-1))


def test_pca_basis_is_orthonormal_projector() -> None:
    basis = estimate_pca_basis(_data(), PATCH, rank=8).double()
    assert basis.shape == (48, 8)
    assert torch.allclose(basis.T @ basis, torch.eye(8, dtype=torch.float64), atol=1e-6)
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    px = project(x, basis, PATCH)
    assert torch.allclose(project(px, basis, PATCH), px, atol=1e-10)  # P² = P
    # The top directions capture most of the data's patch variance, far more than of random noise.
    data = _data(seed=1)
    centred = data - data.mean()
    noise = torch.randn_like(data)
    ratio_data = project(centred, basis, PATCH).pow(2).sum() / centred.pow(2).sum()
    ratio_noise = project(noise, basis, PATCH).pow(2).sum() / noise.pow(2).sum()
    assert ratio_data > 0.5 > ratio_noise


def test_asymflow_recovery_is_exact() -> None:
    """True x0 and eps in, the AsymFlow target as the prediction, v = eps - x0 out."""
    basis = estimate_pca_basis(_data(), PATCH, rank=8).double()
    x0 = _data(4, seed=2)
    eps = torch.randn_like(x0)
    t = torch.tensor([0.05, 0.3, 0.7, 1.0], dtype=torch.float64)
    x_t = interpolate(x0, eps, t)
    flow = FlowMatching(FlowSpec(kind="asymflow", rank=8), PATCH, basis)
    u_a = flow.target(x0, eps)
    assert torch.allclose(u_a, project(eps, basis, PATCH) - x0)
    v = asymflow_velocity(u_a, x_t, t, basis, PATCH)
    assert torch.allclose(v, eps - x0, atol=1e-9)
    # A wrong prediction does not give the true velocity (the test can fail).
    assert not torch.allclose(asymflow_velocity(u_a + 0.1, x_t, t, basis, PATCH), eps - x0, atol=1e-3)


@pytest.mark.parametrize("prediction", ["x", "v"])
def test_standard_velocity_from_true_target(prediction: str) -> None:
    flow = FlowMatching(FlowSpec(prediction=prediction), PATCH)
    x0 = _data(3)
    eps = torch.randn_like(x0)
    t = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    x_t = interpolate(x0, eps, t)
    pred = flow.target(x0, eps)
    assert torch.allclose(flow.velocity(pred, x_t, t).double(), eps - x0, atol=1e-5)
    assert flow.loss(pred, x0, eps) == 0
    assert flow.loss(pred + 1, x0, eps) == pytest.approx(1.0)


def test_asymflow_needs_basis() -> None:
    with pytest.raises(ValueError, match="basis"):
        FlowMatching(FlowSpec(kind="asymflow"), PATCH, None)


def test_logit_normal_t() -> None:
    g = torch.Generator().manual_seed(0)
    t = sample_t(20000, FlowSpec(logit_normal_mean=0.0, logit_normal_std=1.0), g)
    assert 0 < t.min() and t.max() < 1
    assert abs(t.median().item() - 0.5) < 0.02
    shifted = sample_t(20000, FlowSpec(logit_normal_mean=1.0), torch.Generator().manual_seed(0))
    assert shifted.median() > 0.7  # sigmoid(1) = 0.73


@pytest.mark.parametrize("kind,prediction", [("standard", "x"), ("standard", "v"), ("asymflow", "x")])
def test_euler_sampler_with_oracle_reaches_data(kind: str, prediction: str) -> None:
    """With an oracle that knows x0 every conversion path lands the sampler on x0."""
    basis = estimate_pca_basis(_data(), PATCH, rank=8)
    flow = FlowMatching(FlowSpec(kind=kind, prediction=prediction), PATCH, basis)
    x0 = _data(2, seed=3).float()
    noise = torch.randn_like(x0)

    def oracle(x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        tb = t.reshape(-1, 1, 1, 1)
        eps = (x_t - (1 - tb) * x0) / tb  # exact on the straight path (t > 0 always here)
        return flow.velocity(flow.target(x0, eps), x_t, t)

    out = euler_sample(oracle, noise, steps=5)
    assert torch.allclose(out, x0, atol=1e-4)
    with pytest.raises(ValueError):
        euler_sample(oracle, noise, steps=0)


@pytest.mark.parametrize("kind,prediction", [("standard", "x"), ("standard", "v"), ("asymflow", "x")])
def test_velocity_loss_is_one_quantity_for_every_parameterisation(kind: str, prediction: str) -> None:
    """Each arm's exact target scores 0 and the same wrong velocity scores the same, whatever the arm
    predicts: the loss lives in velocity space, so x-prediction and AsymFlow arms compare."""
    x0 = _data(4)
    eps = torch.randn_like(x0, generator=torch.Generator().manual_seed(1))
    t = torch.tensor([0.1, 0.3, 0.6, 0.9], dtype=x0.dtype)
    x_t = interpolate(x0, eps, t)
    basis = estimate_pca_basis(x0, PATCH, 8) if kind == "asymflow" else None
    flow = FlowMatching(FlowSpec(kind=kind, prediction=prediction, rank=8), PATCH, basis)
    exact = flow.velocity_loss(flow.target(x0, eps), x_t, t, x0, eps)
    assert exact.shape == (4,) and exact.max().item() < 1e-6
    # x0 off by delta: the velocity is off by delta / t for every parameterisation
    delta = 0.05
    wrong_x0 = x0 + delta
    wrong = flow.target(wrong_x0, (x_t - (1 - t.view(-1, 1, 1, 1)) * wrong_x0) / t.view(-1, 1, 1, 1))
    loss = flow.velocity_loss(wrong, x_t, t, x0, eps)
    assert torch.allclose(loss.double(), (delta / t) ** 2, rtol=1e-3)


def test_val_timesteps_are_midpoints() -> None:
    from model.flow import val_timesteps

    assert val_timesteps(8).tolist() == [(i + 0.5) / 8 for i in range(8)]
