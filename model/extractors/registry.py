"""The feature extractors the distribution metrics use, by name, each pinned to one Hugging Face commit and the
sha256 of every file it loads (so a metric computed tonight and one computed next year use the same network).

Which extractor a metric uses, and why:
- cmmd: CLIP ViT-L/14 @ 336 px, image tower + projection, embeddings L2-normalised (Jayasumana et al., CVPR 2024).
- dino_mmd, fd_dinov2 during training: DINOv2 ViT-B/14, about 4x cheaper than ViT-L/14 (Stein et al., NeurIPS
  2023, recommend DINOv2 ViT-L/14 for reported FD numbers and find B/14 ranks models alike).
- the final / after-the-night evaluation (FINAL_EXTRACTOR_FOR_METRIC): DINOv2 ViT-L/14 without registers, the
  network Stein et al.'s FD_DINOv2 numbers are computed with, so ours compare with theirs. Photoroom's PRX computes
  DINO-MMD on ViT-L/14 *with* registers at 518 px; its Hugging Face weights have no sha256 we could verify, and an
  unverified pin is no pin, so it is not offered (adding it is one entry here once its hash is checked).

The pins (revision, sha256, size) were read from Git LFS pointers recorded at those commits; `ablate weights
fetch` downloads exactly those bytes or refuses. FID (Inception) is not offered: see docs/distribution-metrics.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Family = Literal["clip", "dinov2"]

# The preprocessing each family was trained with (its image processor's resize, crop and normalisation).
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class PinnedFile:
    """One file of a Hugging Face repository at the entry's revision: its path there, sha256 and size in bytes."""

    filename: str
    sha256: str
    size: int


@dataclass(frozen=True)
class ExtractorEntry:
    """A feature extractor: where its weights are (repo, revision, files), how it is built and fed."""

    name: str
    repo: str
    revision: str  # a commit hash of `repo`, never a branch
    files: tuple[PinnedFile, ...]  # the weights; the architecture is built from code (model/extractors/networks.py)
    family: Family
    width: int  # hidden size of the transformer
    depth: int
    heads: int
    dim: int  # features per image
    resolution: int  # the side the image is resized and centre-cropped to, in pixels
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    normalised: bool  # features come out L2-normalised (CMMD's preprocessing)
    purpose: str  # what it is for, in words (ablate weights list)

    @property
    def weights_bytes(self) -> int:
        return sum(f.size for f in self.files)


EXTRACTORS: dict[str, ExtractorEntry] = {
    entry.name: entry
    for entry in (
        ExtractorEntry(
            name="clip-vit-l-14-336",
            repo="openai/clip-vit-large-patch14-336",
            revision="ce19dc912ca5cd21c8a653c79e251e808ccabcd1",
            # the whole CLIP model (the text tower's tensors are read and dropped); the repo has no safetensors
            files=(PinnedFile("pytorch_model.bin",
                              "c6032c2e0caae3dc2d4fba35535fa6307dbb49df59c7e182b1bc4b3329b81801", 1_711_974_081),),
            family="clip", width=1024, depth=24, heads=16, dim=768, resolution=336,
            mean=CLIP_MEAN, std=CLIP_STD, normalised=True,
            purpose="cmmd (Jayasumana et al. 2024)",
        ),
        ExtractorEntry(
            name="dinov2-vit-b-14",
            repo="facebook/dinov2-base",
            revision="f9e44c814b77203eaa57a6bdbbd535f21ede1415",
            files=(PinnedFile("model.safetensors",
                              "d73036b56966966d07975d696bde331762f37297e2f095de8cea0040c3aa0841", 346_345_912),),
            family="dinov2", width=768, depth=12, heads=12, dim=768, resolution=224,
            mean=IMAGENET_MEAN, std=IMAGENET_STD, normalised=False,
            purpose="dino_mmd and fd_dinov2 during training",
        ),
        ExtractorEntry(
            name="dinov2-vit-l-14",
            repo="facebook/dinov2-large",
            revision="47b73eefe95e8d44ec3623f8890bd894b6ea2d6c",
            files=(PinnedFile("model.safetensors",
                              "399fba97a95f22c36834418bc69373364a99af3a1153da1c0fb31db567c92e23", 1_217_522_888),),
            family="dinov2", width=1024, depth=24, heads=16, dim=1024, resolution=224,
            mean=IMAGENET_MEAN, std=IMAGENET_STD, normalised=False,
            purpose="dino_mmd and fd_dinov2 in final evaluations (Stein et al. 2023)",
        ),
    )
}

# What each distribution metric is computed on at a checkpoint during training, and in a final evaluation
# (POST /api/grids/{id}/evaluations, `ablate evaluate`). fid has no extractor: it is refused at submit.
EXTRACTOR_FOR_METRIC: dict[str, str] = {
    "cmmd": "clip-vit-l-14-336",
    "dino_mmd": "dinov2-vit-b-14",
    "fd_dinov2": "dinov2-vit-b-14",
}
FINAL_EXTRACTOR_FOR_METRIC: dict[str, str] = {
    "cmmd": "clip-vit-l-14-336",
    "dino_mmd": "dinov2-vit-l-14",
    "fd_dinov2": "dinov2-vit-l-14",
}


# The stand-ins an extractor may be replaced by where its weights are missing (model/extractors/extractor.py).
StandInKind = Literal["small", "architecture"]
STANDIN_SUFFIX: dict[StandInKind, str] = {
    "small": "small random stand-in (no weights)",
    "architecture": "random stand-in (no weights)",
}


def extractor_label(name: str, stand_in: StandInKind | None = None) -> str:
    """What every metric computed with extractor `name` carries (`<metric>_extractor`): its name, and for a
    stand-in the words "random stand-in", so a value of random features is never judged as real."""
    return name if stand_in is None else f"{name} {STANDIN_SUFFIX[stand_in]}"


def labels_for_metric(metric: str) -> dict[str, bool]:
    """Every label a value of `metric` may carry, during training or in a final evaluation -> whether it is a
    stand-in's. A label outside it is refused (orchestrator/runs/ingest.py): it is no extractor of ours."""
    names = {m[metric] for m in (EXTRACTOR_FOR_METRIC, FINAL_EXTRACTOR_FOR_METRIC) if metric in m}
    labels = {extractor_label(n): False for n in sorted(names)}
    return labels | {extractor_label(n, kind): True for n in sorted(names) for kind in STANDIN_SUFFIX}


class UnknownExtractor(ValueError):
    """A name that is not in EXTRACTORS; the message lists the known ones."""


def extractor_entry(name: str) -> ExtractorEntry:
    """The registry entry `name`, or UnknownExtractor listing the known names."""
    try:
        return EXTRACTORS[name]
    except KeyError:
        raise UnknownExtractor(f"unknown extractor {name!r}: known are {', '.join(EXTRACTORS)}") from None
