"""REPA (Yu et al. 2024, "Representation Alignment for Generation"): align a middle block's hidden
states, through a bias-free linear projector, to a frozen vision teacher's patch features with a
1 - cos loss; arm E warms the weight down linearly to 0.

Teachers:
- dinov2: weights from `repa.teacher_path`, a plain weights file (a DINOv2 state dict, .pth/.pt/.bin,
  loaded with torch.load(weights_only=True)), e.g. dinov2_vitb14_pretrain.pth. The
  architecture is DINOv2's own, from torch.hub's copy of the fixed official repository
  (facebookresearch/dinov2). A spec never names code: no TorchScript, no hub directory with a
  hubconf.py (torch.hub.load(source="local") would execute it on the worker).
- dinov2 without a path: DINOv2 ViT-B/14 (the REPA paper's teacher), architecture and pretrained
  weights through torch.hub from that official repository into torch's hub cache, once.
- random_standin: a frozen random conv net (fixed seed), for tests and the demo only; it is
  labelled "random_standin" on every run that used it.

The official repository (and pretrained weights) come from torch's hub cache, downloaded there when
missing; with ABLATE_OFFLINE=1 only from the cache, else an error saying how to provide them.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.hub import OFFLINE_ENV, download_timeout, offline
from model.spec import STANDIN, RepaSpec

TEACHER_RES = 224  # DINOv2's training resolution: 16 x 16 patches of 14 px
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
STANDIN_DIM = 128
STANDIN_SEED = 0


class TeacherError(ValueError):
    """A REPA teacher that cannot be loaded; the message names repa.teacher_path and the stand-in."""


class Teacher:
    """A frozen feature extractor: images in [-1, 1] -> patch features on the DiT token grid."""

    def __init__(self, net: nn.Module, dim: int, label: str, patch_fn):
        self.net, self.dim, self.label, self._patch_fn = net, dim, label, patch_fn

    @torch.no_grad()
    def features(self, images: Tensor, grid_hw: tuple[int, int]) -> Tensor:
        """images (B, 3, H, W) in [-1, 1] -> (B, h*w, dim) float32 features, bilinearly resampled to grid_hw."""
        x = (images.float() + 1) / 2  # -> [0, 1]
        x = F.interpolate(x, size=(TEACHER_RES, TEACHER_RES), mode="bicubic", align_corners=False)
        mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1)
        fmap = self._patch_fn((x - mean) / std).float()  # (B, dim, gh, gw)
        fmap = F.interpolate(fmap, size=grid_hw, mode="bilinear", align_corners=False)  # (B, dim, h, w)
        return fmap.flatten(2).transpose(1, 2)  # (B, h*w, dim)


def _tokens_to_map(tokens: Tensor | dict) -> Tensor:
    """(B, N, dim) square patch tokens (or DINOv2's forward_features dict) -> (B, dim, g, g)."""
    if isinstance(tokens, dict):
        tokens = tokens["x_norm_patchtokens"]
    B, N, dim = tokens.shape
    g = int(round(N**0.5))
    if g * g != N:
        raise TeacherError(f"teacher returned {N} patch tokens, not a square grid; export patch tokens only")
    return tokens.transpose(1, 2).reshape(B, dim, g, g)


def _random_standin(device: torch.device | str) -> Teacher:
    gen = torch.Generator().manual_seed(STANDIN_SEED)  # own generator: the global RNG stays untouched
    with torch.random.fork_rng(devices=[]):  # (the layers' default init would draw from it)
        net = nn.Sequential(nn.Conv2d(3, 64, 14, stride=14), nn.GELU(), nn.Conv2d(64, STANDIN_DIM, 1))
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (1.0 / p[0].numel()) ** 0.5)
    net = net.to(device).eval().requires_grad_(False)
    return Teacher(net, STANDIN_DIM, STANDIN, net)


DINOV2_REPO = "facebookresearch/dinov2"  # the architecture's source: fixed, never from a spec
DINOV2_REF = "main"  # its branch, named so torch.hub needs no network lookup to find its cached copy
HUB_ARCH = "dinov2_vitb14"  # without a teacher_path: ViT-B/14, the teacher the REPA paper aligns to
# DINOv2 backbones by embedding width (patch 14): what a state dict's shapes say its architecture is.
DINOV2_BY_DIM = {384: "dinov2_vits14", 768: "dinov2_vitb14", 1024: "dinov2_vitl14", 1536: "dinov2_vitg14"}
WEIGHT_SUFFIXES = (".pt", ".pth", ".bin")


def _load_state_dict(path: Path) -> dict[str, Tensor]:
    """A plain state dict from a weights file; nothing in it can run code."""
    if path.is_dir() or path.suffix.lower() not in WEIGHT_SUFFIXES:
        raise TeacherError(
            f"repa.teacher_path {path} must be a weights file ({', '.join(WEIGHT_SUFFIXES)}: a DINOv2 state dict); "
            "directories, hubconf.py and TorchScript are refused because they are code"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle and zip errors differ; all mean "not a weights file"
        raise TeacherError(f"repa.teacher_path {path} is not a loadable weights file: {exc}") from None
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise TeacherError(f"repa.teacher_path {path} holds no state dict of tensors (got {type(state).__name__})")
    return state


def _dinov2_arch(state: dict[str, Tensor], path: Path) -> str:
    cls = state.get("cls_token")
    dim = int(cls.shape[-1]) if cls is not None else None
    if dim not in DINOV2_BY_DIM:
        raise TeacherError(
            f"repa.teacher_path {path} is not a DINOv2 state dict (cls_token width {dim}; "
            f"expected one of {sorted(DINOV2_BY_DIM)})"
        )
    return DINOV2_BY_DIM[dim]


def hub_cache_paths(arch: str = HUB_ARCH) -> tuple[Path, Path]:
    """Where torch.hub keeps the official dinov2 repository and `arch`'s pretrained weights."""
    hub = Path(torch.hub.get_dir())
    owner, name = DINOV2_REPO.split("/")
    return hub / f"{owner}_{name}_{DINOV2_REF}", hub / "checkpoints" / f"{arch}_pretrain.pth"


def _hub_load(arch: str, pretrained: bool) -> nn.Module:
    """DINOv2 `arch` through torch.hub from the official repository (and its pretrained weights when
    asked): from torch's hub cache, downloaded there when missing unless ABLATE_OFFLINE is set."""
    repo_dir, weights = hub_cache_paths(arch)
    put = f"put {DINOV2_REPO}'s repository at {repo_dir}" + (f" and {weights.name} at {weights}" if pretrained else "")
    advice = f"set repa.teacher_path to a DINOv2 weights file, {put}, or set repa.teacher: {STANDIN}"
    if offline() and not (repo_dir.is_dir() and (weights.is_file() or not pretrained)):
        missing = f"DINOv2 {arch} is not in torch's hub cache and {OFFLINE_ENV} forbids downloading it"
        raise TeacherError(f"{missing}: {advice}")
    try:
        with download_timeout():
            return torch.hub.load(
                f"{DINOV2_REPO}:{DINOV2_REF}", arch, pretrained=pretrained, trust_repo=True, skip_validation=True,
                verbose=False,
            )
    except Exception as exc:  # noqa: BLE001 - URLError, HTTPError, a broken cache: one user error
        raise TeacherError(
            f"DINOv2 {arch} could not be loaded through torch.hub from {DINOV2_REPO} "
            f"({type(exc).__name__}: {exc}): {advice}"
        ) from None


def _frozen_teacher(net: nn.Module, device: torch.device | str) -> Teacher:
    """A DINOv2 net (forward_features -> patch tokens), frozen, as a Teacher."""

    def patch_fn(x: Tensor) -> Tensor:
        return _tokens_to_map(net.forward_features(x))

    net = net.to(device).eval()
    for p in net.parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        probe = patch_fn(torch.zeros(1, 3, TEACHER_RES, TEACHER_RES, device=device))  # (1, dim, g, g)
    return Teacher(net, probe.shape[1], "dinov2", patch_fn)


def _load_dinov2(path: Path, device: torch.device | str) -> Teacher:
    state = _load_state_dict(path)
    arch = _dinov2_arch(state, path)
    net = _hub_load(arch, pretrained=False)
    try:
        net.load_state_dict(state)
    except RuntimeError as exc:
        raise TeacherError(f"repa.teacher_path {path} does not match {arch}: {exc}") from None
    return _frozen_teacher(net, device)


def build_teacher(repa: RepaSpec, device: torch.device | str) -> Teacher:
    """The frozen teacher named by the spec; raises TeacherError with the fix when it cannot load."""
    if repa.teacher == STANDIN:
        return _random_standin(device)
    if not repa.teacher_path:
        return _frozen_teacher(_hub_load(HUB_ARCH, pretrained=True), device)
    path = Path(repa.teacher_path).expanduser()
    if not path.exists():
        raise TeacherError(f"repa.teacher_path {path} does not exist; or set repa.teacher: {STANDIN}")
    return _load_dinov2(path, device)


class RepaProjector(nn.Module):
    """Bias-free linear map from DiT hidden states to the teacher's feature width."""

    def __init__(self, hidden: int, teacher_dim: int):
        super().__init__()
        self.proj = nn.Linear(hidden, teacher_dim, bias=False)

    def forward(self, h: Tensor) -> Tensor:
        return self.proj(h)


def repa_loss(hidden: Tensor, kept: Tensor | None, teacher_feats: Tensor, projector: nn.Module) -> Tensor:
    """Mean over tokens of 1 - cos(projector(hidden), teacher).

    hidden (B, N', D); kept (B, N') token indices when TREAD routed tokens at that block, else None
    (then N' = N); teacher_feats (B, N, dim).
    """
    if kept is not None:
        teacher_feats = torch.gather(teacher_feats, 1, kept[..., None].expand(-1, -1, teacher_feats.shape[-1]))
    pred = projector(hidden).float()  # (B, N', dim)
    return (1 - F.cosine_similarity(pred, teacher_feats.float(), dim=-1)).mean()


def repa_weight(repa: RepaSpec, step: int, total_steps: int) -> float:
    """The REPA loss weight at `step`: 0 when disabled; constant; or linear to 0 at warmdown_end * total_steps."""
    if not repa.enabled:
        return 0.0
    if repa.warmdown_end is None:
        return repa.weight
    end = repa.warmdown_end * total_steps
    if end <= 0:
        return 0.0
    return repa.weight * max(0.0, 1.0 - step / end)
