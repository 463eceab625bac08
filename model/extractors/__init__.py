"""Feature extractors for the distribution metrics (CMMD, DINO-MMD, FD-DINOv2), from `transformers`, with their
weights pinned by Hugging Face revision and sha256.

    from model.extractors import load_extractor, EXTRACTOR_FOR_METRIC
    ex = load_extractor(EXTRACTOR_FOR_METRIC["cmmd"], stand_in="auto", device="cuda")
    features = ex(images)  # (B, 3, H, W) in [-1, 1] -> (B, ex.dim) float32; ex.label goes on every metric

registry: names, pins, which metric uses which; pinned_files: where weights lie, hash checks, the store and the
hub; networks: the architectures and the small stand-in; extractor: Extractor and load_extractor.
"""

from typing import TYPE_CHECKING, Any

from model.extractors.pinned_files import (
    WEIGHTS_DIR_ENV,
    ExtractorWeightsError,
    WeightsHashError,
    default_weights_dir,
)
from model.extractors.registry import (
    EXTRACTOR_FOR_METRIC,
    EXTRACTORS,
    FINAL_EXTRACTOR_FOR_METRIC,
    ExtractorEntry,
    PinnedFile,
    StandInKind,
    UnknownExtractor,
    extractor_entry,
    extractor_label,
    labels_for_metric,
)

if TYPE_CHECKING:
    from model.extractors.extractor import Extractor, StandIn, load_extractor
    from model.extractors.networks import ExtractorLoadError

# torch behind these: imported on first use, so the controller reads the registry (labels, pins) without torch
_WITH_TORCH = {"Extractor": "extractor", "StandIn": "extractor", "load_extractor": "extractor",
               "ExtractorLoadError": "networks"}


def __getattr__(name: str) -> Any:
    if name in _WITH_TORCH:
        import importlib

        return getattr(importlib.import_module(f"model.extractors.{_WITH_TORCH[name]}"), name)
    raise AttributeError(f"module 'model.extractors' has no attribute {name!r}")

__all__ = [
    "EXTRACTORS",
    "EXTRACTOR_FOR_METRIC",
    "FINAL_EXTRACTOR_FOR_METRIC",
    "WEIGHTS_DIR_ENV",
    "Extractor",
    "ExtractorEntry",
    "ExtractorLoadError",
    "ExtractorWeightsError",
    "PinnedFile",
    "StandIn",
    "StandInKind",
    "UnknownExtractor",
    "WeightsHashError",
    "default_weights_dir",
    "extractor_entry",
    "extractor_label",
    "labels_for_metric",
    "load_extractor",
]
