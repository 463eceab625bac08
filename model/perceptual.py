"""LPIPS (Zhang et al. 2018) through the `lpips` package: AlexNet trunk + the package's v0.1 linear layers.

The linear layers ship inside the package; the AlexNet trunk is torchvision's ImageNet alexnet. It
comes from a local torchvision alexnet state dict (the `weights` argument, eval.lpips_weights, or
ABLATE_LPIPS_WEIGHTS), else from torch's hub cache, where torchvision's weights API downloads it
once (hash-checked) when it is missing, as torchvision and `lpips` themselves do. ABLATE_OFFLINE=1
(or a failed download) makes a missing file an error saying how to provide it.
`eval.lpips_backbone: random_standin` builds the same network with a seeded random trunk, labelled
"random_standin" so every metric it produced says so.

Also home of `import_torchvision()`: torchvision 0.28's compiled ops do not load on the CPU torch
build, and its import then fails on "operator torchvision::nms does not exist".
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from model.hub import OFFLINE_ENV, download_timeout, offline
from model.spec import STANDIN, EvalSpec

WEIGHTS_ENV = "ABLATE_LPIPS_WEIGHTS"
STANDIN_SEED = 0  # the random_standin trunk is always this one network
MIN_SIDE = 32  # AlexNet's five stages need >= 23 px; smaller images are upsampled to this

_placeholder_lib: torch.library.Library | None = None  # kept alive: dropping it unregisters the schemas


class LPIPSWeightsError(FileNotFoundError):
    """No usable AlexNet backbone weights; the message says how to provide them, `reason` why they are missing."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message


def _has_torchvision_op(name: str) -> bool:
    try:
        getattr(torch.ops.torchvision, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def import_torchvision() -> ModuleType:
    """`import torchvision`, defining placeholder schemas for torchvision::nms / qnms only if the real ops are missing.

    The placeholders make `torchvision._meta_registrations` importable; models and transforms work,
    detection ops (nms) would raise if called. With a working torchvision build nothing is patched.
    """
    global _placeholder_lib
    if "torchvision" in sys.modules:
        return sys.modules["torchvision"]
    if not _has_torchvision_op("nms"):
        # what torchvision's own import does first; on a matching build this registers the real ops
        spec = importlib.util.find_spec("torchvision")
        if spec is not None and spec.submodule_search_locations:
            for so in Path(next(iter(spec.submodule_search_locations))).glob("_C*.so"):
                with contextlib.suppress(OSError, RuntimeError):
                    torch.ops.load_library(str(so))
    missing = [op for op in ("nms", "qnms") if not _has_torchvision_op(op)]
    if missing and _placeholder_lib is None:
        _placeholder_lib = torch.library.Library("torchvision", "FRAGMENT")  # noqa: TOR901
        schemas = {
            "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
            "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
        }
        for op in missing:
            _placeholder_lib.define(schemas[op])
    import torchvision

    return torchvision


def _import_lpips() -> ModuleType:
    import_torchvision()
    import lpips

    return lpips


def _alexnet_weights() -> Any:
    """torchvision's ImageNet AlexNet weights entry (its URL names the cached file)."""
    return import_torchvision().models.AlexNet_Weights.IMAGENET1K_V1


def torchvision_cache_path() -> Path:
    """Where torchvision keeps the ImageNet AlexNet weights once downloaded: $TORCH_HOME/hub/checkpoints/."""
    url = _alexnet_weights().url
    return Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/", 1)[-1]


def _how_to_provide(cached: Path) -> str:
    return (
        f"set eval.lpips_weights (or the environment variable {WEIGHTS_ENV}) to a torchvision alexnet state "
        f"dict file, place {cached.name} (torchvision's AlexNet_Weights.IMAGENET1K_V1) at {cached}, or choose "
        f"`eval.lpips_backbone: {STANDIN}` (metrics are then labelled {STANDIN})"
    )


def ensure_alexnet_weights() -> Path:
    """The AlexNet weights in torch's hub cache: the cached file, else downloaded there by torchvision's
    weights API (hash-checked), unless ABLATE_OFFLINE is set. LPIPSWeightsError says how to provide them."""
    cached = torchvision_cache_path()
    if cached.is_file():
        return cached
    if offline():
        reason = f"no AlexNet weights for LPIPS in {cached.parent} and {OFFLINE_ENV} forbids downloading them"
        raise LPIPSWeightsError(f"{reason}: {_how_to_provide(cached)}", reason)
    weights = _alexnet_weights()
    try:
        with download_timeout():
            weights.get_state_dict(progress=False, check_hash=True, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - URLError, HTTPError, a hash mismatch, a full disk: one user error
        failure = f"{type(exc).__name__}: {exc}"
        reason = f"the AlexNet weights for LPIPS could not be downloaded from {weights.url} ({failure})"
        raise LPIPSWeightsError(f"{reason}: {_how_to_provide(cached)}", reason) from None
    return cached


def resolve_weights(eval_spec: EvalSpec, weights: Path | str | None = None) -> Path:
    """The AlexNet weights file: `weights`, eval.lpips_weights, $ABLATE_LPIPS_WEIGHTS, then torch's hub
    cache (downloaded there when missing and allowed, see `ensure_alexnet_weights`).

    An explicitly named file that does not exist is an error (never a silent fall-through).
    """
    for source, value in (
        ("the weights argument", weights),
        ("eval.lpips_weights", eval_spec.lpips_weights),
        (WEIGHTS_ENV, os.environ.get(WEIGHTS_ENV) or None),
    ):
        if value is not None:
            path = Path(value).expanduser()
            if not path.is_file():
                raise LPIPSWeightsError(f"LPIPS AlexNet weights file {path} (from {source}) does not exist")
            return path
    return ensure_alexnet_weights()


def _trunk_state(path: Path) -> dict[str, Tensor]:
    """A torchvision alexnet state dict file -> the lpips trunk's keys (features.N.* -> sliceK.N.*)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        raise LPIPSWeightsError(f"LPIPS AlexNet weights {path} could not be loaded: {exc}") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise LPIPSWeightsError(f"LPIPS AlexNet weights {path}: expected a state dict, got {type(state).__name__}")
    # lpips.pretrained_networks.alexnet slices torchvision's alexnet.features at these layer indices
    slices = {0: 1, 1: 1, 2: 2, 3: 2, 4: 2, 5: 3, 6: 3, 7: 3, 8: 4, 9: 4, 10: 5, 11: 5}
    out = {}
    for key, value in state.items():
        key = key.removeprefix("module.")
        parts = key.split(".")
        if parts[0] == "features" and len(parts) == 3 and int(parts[1]) in slices:
            out[f"slice{slices[int(parts[1])]}.{parts[1]}.{parts[2]}"] = value
    return out


class LPIPSMetric:
    """LPIPS distance between image batches in [-1, 1]; `.label` says which trunk produced it."""

    def __init__(self, net: torch.nn.Module, label: str, source: str) -> None:
        self.net = net
        self.label = label  # "alexnet" | "random_standin"
        self.source = source  # the weights file, or "seeded random (seed 0)"

    @torch.no_grad()
    def __call__(self, a: Tensor, b: Tensor) -> Tensor:
        """(B,) LPIPS distances between a and b, both (B, 3, H, W) in [-1, 1] (float32 internally).

        Images under 32 px are bilinearly upsampled to 32 px first (AlexNet needs >= 23 px).
        Runs in float32 even inside an autocast region, so a metric does not depend on the arm's precision.
        """
        if a.shape != b.shape or a.dim() != 4 or a.shape[1] != 3:
            raise ValueError(f"LPIPS needs two (B, 3, H, W) batches of the same shape, got {a.shape} and {b.shape}")
        device = next(self.net.parameters()).device
        a, b = a.to(device, torch.float32), b.to(device, torch.float32)
        if min(a.shape[-2:]) < MIN_SIDE:
            scale = MIN_SIDE / min(a.shape[-2:])
            size = (round(a.shape[-2] * scale), round(a.shape[-1] * scale))
            a = torch.nn.functional.interpolate(a, size=size, mode="bilinear", align_corners=False)
            b = torch.nn.functional.interpolate(b, size=size, mode="bilinear", align_corners=False)
        with torch.autocast(device.type, enabled=False):
            return self.net(a, b).flatten()

    def to(self, device: torch.device | str) -> LPIPSMetric:
        self.net.to(device)
        return self


_standin_net: torch.nn.Module | None = None  # built once per process: AlexNet's init takes seconds


def _standin() -> torch.nn.Module:
    """A fresh copy of lpips.LPIPS(alex, v0.1) with the seeded random trunk and the package's linear layers.

    pnet_rand builds the trunk without pretrained weights, so nothing downloads. Built under a forked
    RNG: the caller's random stream is untouched, and every copy is the same network.
    """
    global _standin_net
    if _standin_net is None:
        lpips = _import_lpips()
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            torch.manual_seed(STANDIN_SEED)
            # lpips still passes torchvision's deprecated `pretrained=False`; it means weights=None
            warnings.filterwarnings("ignore", category=UserWarning, module="torchvision")
            net = lpips.LPIPS(net="alex", version="0.1", pretrained=True, pnet_rand=True, verbose=False)
        _standin_net = net.eval().requires_grad_(False)
    return copy.deepcopy(_standin_net)


def load_lpips(
    eval_spec: EvalSpec, weights: Path | str | None = None, device: torch.device | str = "cpu"
) -> LPIPSMetric:
    """The LPIPS metric eval_spec asks for.

    alexnet: the trunk from a local weights file or torch's hub cache, downloaded when allowed (see
    `resolve_weights`), else LPIPSWeightsError naming eval.lpips_weights and
    `eval.lpips_backbone: random_standin`. random_standin: a seeded random trunk,
    identical across constructions. Construction never touches the caller's global RNG state.
    """
    if eval_spec.lpips_backbone == STANDIN:
        return LPIPSMetric(_standin().to(device), STANDIN, f"seeded random (seed {STANDIN_SEED})")

    path = resolve_weights(eval_spec, weights)
    trunk = _trunk_state(path)
    net = _standin()  # then every trunk tensor is replaced from the file (strict load)
    expected = net.net.state_dict()
    missing = sorted(set(expected) - set(trunk))
    if missing:
        raise LPIPSWeightsError(
            f"LPIPS AlexNet weights {path} are not a torchvision alexnet state dict "
            f"(no features.* entries for {len(missing)} trunk tensors, e.g. {missing[0]})"
        )
    bad = [k for k in expected if expected[k].shape != trunk[k].shape]
    if bad:
        raise LPIPSWeightsError(
            f"LPIPS AlexNet weights {path}: shape mismatch for {bad[0]} "
            f"({tuple(trunk[bad[0]].shape)} vs {tuple(expected[bad[0]].shape)})"
        )
    net.net.load_state_dict(trunk, strict=True)
    return LPIPSMetric(net.to(device), "alexnet", str(path))
