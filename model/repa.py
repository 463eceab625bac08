"""REPA (Yu et al. 2024, "Representation Alignment for Generation"): align a middle block's hidden
states, through a bias-free linear projector, to a frozen vision teacher's patch features with a
1 - cos loss; arm E warms the weight down linearly to 0.

Teachers (nothing is downloaded at run time):
- dinov2: from `repa.teacher_path`, either a TorchScript file (torch.jit.save of a module mapping
  ImageNet-normalised (B, 3, 224, 224) images to (B, N, dim) patch tokens, or to DINOv2's
  forward_features dict) or a torch.hub-style local directory (a dinov2 checkout with hubconf.py
  plus a `dinov2_<arch>*.pth` weights file, e.g. dinov2_vitb14_pretrain.pth).
- random_standin: a frozen random conv net (fixed seed), for tests and the demo only; it is
  labelled "random_standin" on every run that used it.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.spec import RepaSpec

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
    return Teacher(net, STANDIN_DIM, "random_standin", net)


def _load_dinov2(path: Path, device: torch.device | str) -> Teacher:
    if path.is_dir():
        weights = sorted(path.glob("dinov2_*.pth"))
        if not (path / "hubconf.py").exists() or not weights:
            raise TeacherError(
                f"repa.teacher_path {path} is a directory but not a dinov2 hub checkout with a weights file "
                "(needs hubconf.py and dinov2_<arch>*.pth)"
            )
        arch = "_".join(weights[0].stem.split("_")[:2])  # dinov2_vitb14_pretrain -> dinov2_vitb14
        net = torch.hub.load(str(path), arch, source="local", pretrained=False)
        net.load_state_dict(torch.load(weights[0], map_location="cpu", weights_only=True))

        def patch_fn(x: Tensor) -> Tensor:
            return _tokens_to_map(net.forward_features(x))
    else:
        try:
            net = torch.jit.load(str(path), map_location="cpu")
        except Exception as exc:  # torch raises RuntimeError/ValueError variants for non-TorchScript files
            raise TeacherError(f"repa.teacher_path {path} is not a loadable TorchScript file: {exc}") from exc

        def patch_fn(x: Tensor) -> Tensor:
            return _tokens_to_map(net(x))

    net = net.to(device).eval()
    for p in net.parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        probe = patch_fn(torch.zeros(1, 3, TEACHER_RES, TEACHER_RES, device=device))  # (1, dim, g, g)
    return Teacher(net, probe.shape[1], "dinov2", patch_fn)


def build_teacher(repa: RepaSpec, device: torch.device | str) -> Teacher:
    """The frozen teacher named by the spec; raises TeacherError with the fix when it cannot load."""
    if repa.teacher == "random_standin":
        return _random_standin(device)
    if not repa.teacher_path:
        raise TeacherError(
            "repa.teacher 'dinov2' needs repa.teacher_path (a TorchScript file or a local dinov2 hub checkout "
            "with weights; nothing is downloaded), or set repa.teacher: random_standin (a labelled stand-in)"
        )
    path = Path(repa.teacher_path).expanduser()
    if not path.exists():
        raise TeacherError(f"repa.teacher_path {path} does not exist; or set repa.teacher: random_standin")
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
