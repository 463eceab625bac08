"""Rectified flow matching (x- or v-prediction) and AsymFlow, plus the Euler sampler.

Convention (rectified flow, Liu et al. 2022; logit-normal t from SD3, Esser et al. 2024):
x_t = (1 - t)·x0 + t·eps, t = 0 is data and t = 1 is noise, velocity v = dx_t/dt = eps - x0.
Sampling integrates from t = 1 down to t = 0.

AsymFlow: the network predicts u_A = P·eps - x0, where P projects each image patch onto the top-r
PCA subspace of data patches (estimated once from the data). Inside the subspace the target is a
velocity, outside it is -x0; the full velocity is recovered analytically (`asymflow_velocity`), so neither
the network nor the sampler changes. The maths are pure functions testable with tiny tensors.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from model.spec import FlowSpec

# Smallest t used when dividing by t (x-prediction and AsymFlow recovery): the recovery of eps is
# ill-conditioned at t -> 0 and the sampler never evaluates there anyway.
T_MIN = 1e-3


def sample_t(
    n: int, flow: FlowSpec, generator: torch.Generator | None = None, device: str | torch.device = "cpu"
) -> Tensor:
    """(n,) training times from a logit-normal distribution: sigmoid(N(mean, std))."""
    z = torch.randn(n, generator=generator, device=device)
    return torch.sigmoid(flow.logit_normal_mean + flow.logit_normal_std * z)


def _bcast(t: Tensor, x: Tensor) -> Tensor:
    """(B,) -> (B, 1, 1, 1) for broadcasting against images."""
    return t.reshape(-1, *([1] * (x.dim() - 1))).to(x.dtype)


def interpolate(x0: Tensor, eps: Tensor, t: Tensor) -> Tensor:
    """x_t = (1 - t)·x0 + t·eps."""
    tb = _bcast(t, x0)
    return (1 - tb) * x0 + tb * eps


# --- patch-wise projection -------------------------------------------------------------------------


def patchify(x: Tensor, patch: int) -> Tensor:
    """(B, C, H, W) -> (B, N, C·p·p) non-overlapping patches, row-major over the patch grid."""
    b, c, h, w = x.shape
    if h % patch or w % patch:
        raise ValueError(f"image {h}x{w} is not divisible by the patch size {patch}")
    x = x.reshape(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // patch) * (w // patch), c * patch * patch)


def unpatchify(p: Tensor, patch: int, c: int, h: int, w: int) -> Tensor:
    """Inverse of `patchify`: (B, N, C·p·p) -> (B, C, H, W)."""
    b = p.shape[0]
    x = p.reshape(b, h // patch, w // patch, c, patch, patch)
    return x.permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def estimate_pca_basis(images: Tensor, patch: int, rank: int) -> Tensor:
    """(C·p·p, rank) orthonormal basis of the top-`rank` principal directions of the images' patches.

    Patches are centred before the SVD (principal directions of the covariance); P = U·Uᵀ is then an
    orthogonal projector, which is all the AsymFlow recovery needs. Computed in float64 for a clean basis,
    returned in the images' floating dtype.
    """
    patches = patchify(images.detach().double().cpu(), patch).reshape(-1, images.shape[1] * patch * patch)
    if rank > patches.shape[1]:
        raise ValueError(f"flow.rank ({rank}) exceeds the patch dimension {patches.shape[1]}")
    centred = patches - patches.mean(dim=0, keepdim=True)
    # Right singular vectors = eigenvectors of the patch covariance, sorted by singular value.
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    return vh[:rank].T.contiguous().to(images.dtype if images.is_floating_point() else torch.float32)


def project(x: Tensor, basis: Tensor, patch: int) -> Tensor:
    """P·x: each patch of x projected onto span(basis). basis: (C·p·p, r) orthonormal columns."""
    b, c, h, w = x.shape
    u = basis.to(device=x.device, dtype=x.dtype)
    p = patchify(x, patch)  # (B, N, D)
    return unpatchify((p @ u) @ u.T, patch, c, h, w)


def asymflow_velocity(u_a: Tensor, x_t: Tensor, t: Tensor, basis: Tensor, patch: int) -> Tensor:
    """Full velocity from an AsymFlow prediction u_A ≈ P·eps - x0, for x_t = (1-t)·x0 + t·eps:

    (I-P)·x0 = -(I-P)·u_A (outside the subspace u_A is -x0); P·x0 = P·x_t - t·P·u_A (inside, P·x_t =
    P·x0 + t·(P·eps - P·x0) and P·u_A = P·eps - P·x0); eps = (x_t - (1-t)·x0) / t;  v = eps - x0.
    t is clamped to >= T_MIN where it divides.
    """
    tb = _bcast(t, x_t)
    pu = project(u_a, basis, patch)
    x0 = -(u_a - pu) + project(x_t, basis, patch) - tb * pu
    eps = (x_t - (1 - tb) * x0) / tb.clamp_min(T_MIN)
    return eps - x0


# --- the objective ---------------------------------------------------------------------------------


class FlowMatching:
    """Training target, loss and velocity conversion for one arm's flow settings.

    kind "standard": the network predicts x0 (prediction "x", the study's choice) or v = eps - x0 ("v").
    kind "asymflow": the network predicts u_A = P·eps - x0 whatever `prediction` says; `basis` is required.
    """

    def __init__(self, flow: FlowSpec, patch: int, basis: Tensor | None = None) -> None:
        if flow.kind == "asymflow" and basis is None:
            raise ValueError("flow.kind 'asymflow' needs a PCA basis (estimate_pca_basis on data patches)")
        self.spec = flow
        self.patch = patch
        self.basis = basis

    @property
    def predicts(self) -> str:
        """What the network output means: "x0", "v" or "u_A"."""
        if self.spec.kind == "asymflow":
            return "u_A"
        return "x0" if self.spec.prediction == "x" else "v"

    def target(self, x0: Tensor, eps: Tensor) -> Tensor:
        """What the network should output for this (x0, eps) pair."""
        if self.predicts == "u_A":
            assert self.basis is not None
            return project(eps, self.basis, self.patch) - x0
        if self.predicts == "x0":
            return x0
        return eps - x0

    def loss(self, pred: Tensor, x0: Tensor, eps: Tensor) -> Tensor:
        """Mean squared error between the prediction and the target (computed in float32)."""
        return torch.mean((pred.float() - self.target(x0, eps).float()) ** 2)

    def velocity(self, pred: Tensor, x_t: Tensor, t: Tensor) -> Tensor:
        """Convert a network prediction at (x_t, t) to the velocity eps - x0."""
        pred = pred.float()
        x_t = x_t.float()
        if self.predicts == "v":
            return pred
        if self.predicts == "x0":
            # eps = (x_t - (1-t)·x0)/t, so v = eps - x0 = (x_t - x0)/t.
            return (x_t - pred) / _bcast(t, x_t).clamp_min(T_MIN)
        assert self.basis is not None
        return asymflow_velocity(pred, x_t, t, self.basis, self.patch)

    def velocity_loss(self, pred: Tensor, x_t: Tensor, t: Tensor, x0: Tensor, eps: Tensor) -> Tensor:
        """(B,) per-sample velocity-space flow loss: mean over pixels of (v_hat - (eps - x0))^2, float32.

        v_hat is the prediction converted by this arm's own parameterisation (x0, v or u_A), so arms with
        different targets are judged on the same quantity: for a v-prediction arm it is its training
        loss, for an x-prediction arm its x0 error weighted by 1/t^2, for AsymFlow the recovered velocity's.
        """
        v = self.velocity(pred, x_t, t)
        return ((v - (eps.float() - x0.float())) ** 2).flatten(1).mean(dim=1)


def val_timesteps(k: int = 8) -> Tensor:
    """(k,) evenly spaced evaluation times, the midpoints (i + 0.5)/k: never t = 0 (x-prediction is exact
    there and its velocity undefined) nor t = 1 (pure noise)."""
    return (torch.arange(k, dtype=torch.float32) + 0.5) / k


def euler_sample(model_fn: Callable[[Tensor, Tensor], Tensor], noise: Tensor, steps: int) -> Tensor:
    """Integrate dx/dt = v from t = 1 (noise) to t = 0 with `steps` uniform Euler steps; returns x0.

    model_fn(x_t, t) must return the velocity (use FlowMatching.velocity on the raw prediction).
    """
    if steps < 1:
        raise ValueError(f"sampler steps must be >= 1, got {steps}")
    x = noise.float()
    ts = torch.linspace(1.0, 0.0, steps + 1, device=noise.device)
    for i in range(steps):
        t = ts[i].expand(x.shape[0])
        v = model_fn(x, t).float()
        x = x + (ts[i + 1] - ts[i]) * v
    return x
