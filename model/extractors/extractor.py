"""`load_extractor(name)`: a feature extractor for the distribution metrics, with its pinned weights checked by
sha256 before use, or a labelled stand-in where there are none (never silently)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.extractors.networks import SMALL_DIM, SMALL_RESOLUTION, build, load_pretrained, standin_seed
from model.extractors.pinned_files import ExtractorWeightsError, default_weights_dir, resolve_weights
from model.extractors.registry import ExtractorEntry, extractor_entry, extractor_label

StandIn = Literal["auto", "small", "architecture"]
BATCH = 64  # images per forward pass: bounds activation memory whatever batch the caller hands in


class Extractor:
    """Images (B, 3, H, W) in [-1, 1] -> (B, dim) float32 features, as the metric's network expects them fed.

    name: the registry name; label: what every metric computed with it must carry ("clip-vit-l-14-336", or
    "clip-vit-l-14-336 random stand-in (no weights)"); stand_in: True when the weights are random; source: the
    weights files, or the stand-in's seed; reason: why a stand-in was used (None for the real one);
    normalised: the features are unit vectors (CLIP for CMMD).
    """

    def __init__(self, entry: ExtractorEntry, net: nn.Module, *, stand_in: str | None, source: str,
                 reason: str | None = None) -> None:
        self.entry = entry
        self.net = net
        self.name = entry.name
        self.stand_in = stand_in is not None
        self.kind = stand_in or "weights"  # "weights" | "small" | "architecture"
        self.label = extractor_label(entry.name, stand_in)  # type: ignore[arg-type]
        self.dim = SMALL_DIM if stand_in == "small" else entry.dim
        self.resolution = SMALL_RESOLUTION if stand_in == "small" else entry.resolution
        self.normalised = entry.normalised
        self.source = source
        self.reason = reason
        self._mean = torch.tensor(entry.mean).view(1, 3, 1, 1)
        self._std = torch.tensor(entry.std).view(1, 3, 1, 1)

    def __repr__(self) -> str:
        return f"Extractor({self.label!r}, dim={self.dim}, resolution={self.resolution}, source={self.source!r})"

    @property
    def device(self) -> torch.device:
        return next(self.net.parameters()).device

    def to(self, device: torch.device | str) -> Extractor:
        self.net.to(device)
        return self

    def preprocess(self, images: Tensor) -> Tensor:
        """[-1, 1] images -> the network's input: [0, 1], the short side resized to `resolution` (bicubic,
        antialiased, as the CLIP and DINOv2 image processors resize), centre-cropped square, clamped (bicubic
        overshoots) and normalised with the network's mean and std."""
        x = ((images.to(self.device, torch.float32) + 1) / 2).clamp(0, 1)
        h, w = x.shape[-2:]
        scale = self.resolution / min(h, w)
        size = (max(self.resolution, round(h * scale)), max(self.resolution, round(w * scale)))
        if size != (h, w):
            x = F.interpolate(x, size=size, mode="bicubic", antialias=True, align_corners=False).clamp(0, 1)
        top, left = (size[0] - self.resolution) // 2, (size[1] - self.resolution) // 2
        x = x[..., top:top + self.resolution, left:left + self.resolution]
        return (x - self._mean.to(x.device)) / self._std.to(x.device)

    @torch.no_grad()
    def __call__(self, images: Tensor) -> Tensor:
        """(B, dim) float32 features of (B, 3, H, W) images in [-1, 1], in float32 whatever autocast is active
        (a metric must not depend on an arm's precision); unit rows where `normalised`."""
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"{self.name} takes (B, 3, H, W) images in [-1, 1], got shape {tuple(images.shape)}")
        out = []
        with torch.autocast(self.device.type, enabled=False):
            for chunk in images.split(BATCH):
                out.append(self.net(self.preprocess(chunk)).float())
        features = torch.cat(out) if out else torch.empty(0, self.dim, device=self.device)
        if self.normalised:
            features = features / features.norm(dim=1, keepdim=True).clamp_min(1e-12)
        return features


def load_extractor(
    name: str,
    *,
    weights_dir: Path | None = None,
    stand_in: StandIn | None = None,
    device: torch.device | str = "cpu",
    store_url: str | None = None,
    store_options: dict[str, Any] | None = None,
) -> Extractor:
    """The extractor `name` (model/extractors/registry.py) on `device`.

    stand_in None: the real weights, strictly: under weights_dir (default $ABLATE_WEIGHTS_DIR, else
      <home>/weights) as <name>/<file>, else copied there from the checkpoint store when store_url is given
      (where `ablate weights fetch` staged them). Each file's sha256 is checked before it is read:
      WeightsHashError names the file, the pinned and the found hash; ExtractorWeightsError says how to
      provide missing ones. Nothing is downloaded here.
    stand_in "auto": the real weights where they are, else a stand-in labelled as one with the reason: the
      real architecture with seeded random weights on a GPU (its costs are real), the small one on a CPU.
      A file with the wrong hash on this node's own disk is still an error, never a reason to fall back; a
      corrupt file in the store (any store-writing node can put one there) is absent, the reason saying so.
    stand_in "architecture" / "small": that stand-in, whatever weights exist.
    Every stand-in is the same network for a given name in every process, so its features are paired across arms.
    """
    entry = extractor_entry(name)
    seed = f"seeded random (seed {standin_seed(entry.name)})"
    if stand_in in ("small", "architecture"):
        net = build(entry, small=stand_in == "small")
        return Extractor(entry, net.to(device), stand_in=stand_in, source=seed, reason="asked for")
    folder = weights_dir if weights_dir is not None else default_weights_dir()
    try:
        files = resolve_weights(entry, folder, store_url, store_options)
    except ExtractorWeightsError as exc:
        if stand_in is None:
            raise
        choice = "architecture" if torch.device(device).type != "cpu" else "small"
        net = build(entry, small=choice == "small")
        return Extractor(entry, net.to(device), stand_in=choice, source=seed, reason=str(exc))
    net = load_pretrained(entry, files)
    return Extractor(entry, net.to(device), stand_in=None, source=", ".join(str(p) for p in files.values()))
