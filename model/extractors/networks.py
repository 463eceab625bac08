"""The extractors' networks: the real architectures from `transformers`, built from configs written here (nothing
is downloaded to build them), their pinned weights loaded strictly, and the small stand-in for CPU tests.

Every network returns (B, dim) features from (B, 3, R, R) images already normalised as it expects:
- CLIP: CLIPVisionModelWithProjection's image_embeds (the projected pooled CLS token), as CMMD uses them;
- DINOv2: Dinov2Model's pooler_output, the final-layer-normed CLS token, as Stein et al.'s FD_DINOv2 uses it.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import torch
from torch import Tensor, nn

from model.extractors.registry import ExtractorEntry

# Tensors a whole-CLIP checkpoint holds that the image tower does not use (and the non-persistent position ids).
_CLIP_UNUSED = ("text_model.", "text_projection.", "logit_scale", "vision_model.embeddings.position_ids")
SMALL_DIM = 64  # the small stand-in's features: enough to exercise MMD and FD, cheap on CPU
SMALL_RESOLUTION = 64


class ExtractorLoadError(ValueError):
    """A verified weights file that still does not fit the architecture (a wrong pin in the registry)."""


def standin_seed(name: str) -> int:
    """The seed of a stand-in's random weights: fixed per extractor name, so every arm, seed and node computes
    features with the same random network (a stand-in metric is still paired across arms)."""
    return zlib.crc32(name.encode())


def _import_transformers() -> None:
    """transformers imports torchvision when it is installed; the CPU torch build needs its placeholder ops."""
    from model.perceptual import import_torchvision

    try:
        import_torchvision()
    except ImportError:  # no torchvision at all: transformers does without it
        pass


class _ClipImageTower(nn.Module):
    def __init__(self, entry: ExtractorEntry) -> None:
        super().__init__()
        _import_transformers()
        from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

        # openai/clip-vit-large-patch14-336's vision_config
        config = CLIPVisionConfig(
            hidden_size=entry.width, intermediate_size=4 * entry.width, num_hidden_layers=entry.depth,
            num_attention_heads=entry.heads, image_size=entry.resolution, patch_size=14, projection_dim=entry.dim,
            hidden_act="quick_gelu", layer_norm_eps=1e-5,
        )
        self.model = CLIPVisionModelWithProjection(config)

    def forward(self, pixels: Tensor) -> Tensor:  # (B, 3, R, R) -> (B, dim)
        return self.model(pixel_values=pixels).image_embeds


class _DinoV2(nn.Module):
    def __init__(self, entry: ExtractorEntry) -> None:
        super().__init__()
        _import_transformers()
        from transformers import Dinov2Config, Dinov2Model

        # facebook/dinov2-{base,large}'s config.json (image_size 518: the position embeddings are interpolated)
        config = Dinov2Config(
            hidden_size=entry.width, num_hidden_layers=entry.depth, num_attention_heads=entry.heads, mlp_ratio=4,
            patch_size=14, image_size=518, layerscale_value=1.0, layer_norm_eps=1e-6, qkv_bias=True,
            use_swiglu_ffn=False, hidden_act="gelu", drop_path_rate=0.0,
        )
        self.model = Dinov2Model(config)

    def forward(self, pixels: Tensor) -> Tensor:  # (B, 3, R, R) -> (B, dim)
        return self.model(pixel_values=pixels).pooler_output


class SmallStandIn(nn.Module):
    """Two strided convolutions, a pooled grid and a linear map: a fast, deterministic feature extractor with the
    real one's contract ((B, 3, R, R) -> (B, SMALL_DIM)), for tests on CPU. Its features mean nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv2d(3, 16, kernel_size=4, stride=4), nn.GELU(),  # (B, 16, R/4, R/4)
            nn.Conv2d(16, 32, kernel_size=4, stride=4), nn.GELU(),  # (B, 32, R/16, R/16)
            nn.AdaptiveAvgPool2d(4),  # (B, 32, 4, 4)
        )
        self.head = nn.Linear(32 * 16, SMALL_DIM)

    def forward(self, pixels: Tensor) -> Tensor:
        return self.head(self.convs(pixels).flatten(1))


def build(entry: ExtractorEntry, small: bool = False) -> nn.Module:
    """The entry's network (or the small stand-in) with seeded random weights, in eval mode, frozen. Built on
    the CPU under a forked RNG: the caller's random stream is untouched and every build is the same network."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(standin_seed(entry.name))
        if small:
            net: nn.Module = SmallStandIn()
        elif entry.family == "clip":
            net = _ClipImageTower(entry)
        else:
            net = _DinoV2(entry)
    return net.eval().requires_grad_(False)


def _read_state(path: Path) -> dict[str, Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(path, map_location="cpu", weights_only=True)  # weights_only: tensors, never code


def load_weights(net: nn.Module, entry: ExtractorEntry, files: dict[str, Path]) -> nn.Module:
    """The verified files' tensors into `net` (a build() of the entry), every tensor of it present and of its
    shape; the checkpoint's extra tensors (CLIP's text tower) are dropped. ExtractorLoadError otherwise."""
    model = net.model  # type: ignore[union-attr]  # _ClipImageTower / _DinoV2
    expected = model.state_dict()
    state: dict[str, Tensor] = {}
    for path in files.values():
        state.update(_read_state(path))
    state = {k: v for k, v in state.items() if k in expected or not k.startswith(_CLIP_UNUSED)}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ExtractorLoadError(
            f"{entry.name}: {', '.join(map(str, files.values()))} does not fit the {entry.family} architecture "
            f"({len(missing)} tensors missing, e.g. {missing[:1]}; "
            f"{len(unexpected)} unexpected, e.g. {unexpected[:1]})")
    bad = [k for k in expected if expected[k].shape != state[k].shape]
    if bad:
        raise ExtractorLoadError(f"{entry.name}: {bad[0]} is {tuple(state[bad[0]].shape)} in the weights, "
                                 f"{tuple(expected[bad[0]].shape)} in the architecture")
    model.load_state_dict(state, strict=True)
    return net
