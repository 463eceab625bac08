"""The extractors' networks: the real architectures from `transformers`, built from configs written here (nothing
is downloaded to build them), their pinned weights loaded strictly, and the small stand-in for CPU tests.

Every network returns (B, dim) features from (B, 3, R, R) images already normalised as it expects:
- CLIP: CLIPVisionModelWithProjection's image_embeds (the projected pooled CLS token), as CMMD uses them;
- DINOv2: Dinov2Model's pooler_output, the final-layer-normed CLS token, as Stein et al.'s FD_DINOv2 uses it.
"""

from __future__ import annotations

import tempfile
import warnings
import zlib
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from model.extractors.registry import ExtractorEntry

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


def _architecture(entry: ExtractorEntry) -> tuple[type, Any]:
    """(the transformers model class, its config written here) for the entry: nothing is downloaded."""
    _import_transformers()
    if entry.family == "clip":
        from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

        # openai/clip-vit-large-patch14-336's vision_config
        return CLIPVisionModelWithProjection, CLIPVisionConfig(
            hidden_size=entry.width, intermediate_size=4 * entry.width, num_hidden_layers=entry.depth,
            num_attention_heads=entry.heads, image_size=entry.resolution, patch_size=14, projection_dim=entry.dim,
            hidden_act="quick_gelu", layer_norm_eps=1e-5,
        )
    from transformers import Dinov2Config, Dinov2Model

    # facebook/dinov2-{base,large}'s config.json (image_size 518: the position embeddings are interpolated)
    return Dinov2Model, Dinov2Config(
        hidden_size=entry.width, num_hidden_layers=entry.depth, num_attention_heads=entry.heads, mlp_ratio=4,
        patch_size=14, image_size=518, layerscale_value=1.0, layer_norm_eps=1e-6, qkv_bias=True,
        use_swiglu_ffn=False, hidden_act="gelu", drop_path_rate=0.0,
    )


class FeatureNetwork(nn.Module):
    """A transformers CLIP image tower or DINOv2 model, answering (B, 3, R, R) -> (B, dim) features."""

    def __init__(self, family: str, model: nn.Module) -> None:
        super().__init__()
        self.family = family
        self.model = model

    def forward(self, pixels: Tensor) -> Tensor:
        out = self.model(pixel_values=pixels)
        return out.image_embeds if self.family == "clip" else out.pooler_output


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
        else:
            cls, config = _architecture(entry)
            net = FeatureNetwork(entry.family, cls(config))
    return net.eval().requires_grad_(False)


def load_pretrained(entry: ExtractorEntry, files: dict[str, Path]) -> FeatureNetwork:
    """The entry's network with the verified files' weights, through transformers' own from_pretrained on a
    folder of this config and links to the files (local only: nothing is downloaded). from_pretrained renames
    the published checkpoint's keys to the installed version's modules (DINOv2's attention.attention.query is
    attention.q_proj in transformers 5) and drops what the image tower does not use (CLIP's text tower). Every
    tensor of the network must come from the files, in its shape: ExtractorLoadError otherwise."""
    cls, config = _architecture(entry)
    with tempfile.TemporaryDirectory(prefix="extractor-") as tmp:
        config.save_pretrained(tmp)
        for filename, path in files.items():
            (Path(tmp) / filename).symlink_to(path.resolve())
        from transformers.utils import logging as hf_logging

        bar = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # a worker's log is no terminal
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # its notes on unused checkpoint tensors: checked below instead
                model, info = cls.from_pretrained(tmp, local_files_only=True, output_loading_info=True,
                                                  dtype=torch.float32)
        finally:
            if bar:
                hf_logging.enable_progress_bar()
    missing, mismatched = list(info.get("missing_keys", ())), list(info.get("mismatched_keys", ()))
    if missing or mismatched:
        raise ExtractorLoadError(
            f"{entry.name}: {', '.join(map(str, files.values()))} does not fit the {entry.family} architecture "
            f"({len(missing)} tensors missing, e.g. {missing[:1]}; {len(mismatched)} of another shape, "
            f"e.g. {mismatched[:1]})")
    return FeatureNetwork(entry.family, model).eval().requires_grad_(False)
