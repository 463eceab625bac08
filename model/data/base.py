"""The common interface of the image-caption datasets, the pixel ranges and the word tokenizer.

Every dataset hands out float32 images (B, 3, H, W) in the spec's pixel range ("unit" = [0, 1], the
study's arms A-E; "symmetric" = [-1, 1], arm F's fix) with one caption per image, a fixed held-out
split disjoint from training, and single-attribute caption edits for the text-manipulation metric.
The trainer draws step s's images by `step_indices(seed, s)`, a pure function, so the stream is the
same whatever the number of loader workers and across a resume (see model/data/loader.py).
Nothing is downloaded: shapes are rendered, digits ship with scikit-learn, folders and shards are local.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor

PixelRange = Literal["unit", "symmetric"]


class DatasetError(ValueError):
    """Bad dataset input (missing file, corrupt image, malformed captions.jsonl); the message names it."""


class NoEditsError(DatasetError):
    """No caption of the dataset admits a single-attribute edit, so text_manip_delta cannot be computed."""


def resolve_inside(root: Path, name: str, where: str) -> Path:
    """root/name with symlinks followed, refused unless it stays inside root: a listing or a manifest
    must not make the run read (and serve as held-out targets) files from elsewhere on the node.

    where: the listing and line, or the manifest, for the message.
    """
    base = root.resolve()
    path = (base / name).resolve()  # an absolute name replaces base, and is refused below like '..'
    if not path.is_relative_to(base):
        raise DatasetError(
            f"{where}: {name!r} resolves to {path}, outside the dataset directory {base}; name files inside it "
            "(no '..', absolute paths or links that lead out)"
        )
    return path


_WORD = re.compile(r"[^\W_]+")  # runs of letters or digits, any script


def tokenize(caption: str) -> list[str]:
    """The built-in word-level tokenizer: lower-cased runs of letters/digits; punctuation and spacing dropped."""
    return _WORD.findall(caption.lower())


# ---------------------------------------------------------------- pixel range


def to_unit(images: Tensor, pixel_range: PixelRange) -> Tensor:
    """Images in `pixel_range` -> [0, 1]."""
    return images if pixel_range == "unit" else (images + 1) / 2


def from_unit(images: Tensor, pixel_range: PixelRange) -> Tensor:
    """Images in [0, 1] -> `pixel_range`."""
    return images if pixel_range == "unit" else images * 2 - 1


def to_lpips(images: Tensor, pixel_range: PixelRange) -> Tensor:
    """Images in `pixel_range` -> [-1, 1], the range LPIPS expects."""
    return images * 2 - 1 if pixel_range == "unit" else images


def as_unit_float(images: Tensor) -> Tensor:
    """uint8 0..255 or float [0, 1] images -> float32 in [0, 1] (on whatever device they are)."""
    return images.float().div(255.0) if images.dtype == torch.uint8 else images


# ---------------------------------------------------------------- the step's items

_STEP_SALT = 0xDA7A  # keeps these streams apart from any other use of the data seed


def step_indices(seed: int, step: int, batch_size: int, num_train: int) -> np.ndarray:
    """The training items of optimizer step `step` (with replacement): a pure function of its arguments.

    The micro-batches of a step are consecutive slices of this, so the global batch does not depend on
    the micro-batch size either.
    """
    return np.random.default_rng([seed, _STEP_SALT, step]).integers(num_train, size=batch_size)


def identity_draw(seed: int, step: int, micro: int, prob: float) -> bool:
    """Whether micro-batch `micro` of step `step` conditions on the targets' identity tokens."""
    return bool(np.random.default_rng([seed, _STEP_SALT, step, micro + 1]).random() < prob)


# ---------------------------------------------------------------- the common interface


class ImageCaptionDataset:
    """Base of the datasets (shapes, digits and the captioned folder, tar and prepared sources): subclasses
    render items of the train / held-out split in [0, 1]."""

    name = "base"
    # caption -> (tokens, dim) float32 embeddings stored with a captioned dataset (folder, tar, prepared).
    text_embeddings: dict[str, Tensor] | None = None

    def __init__(self, resolution: int, pixel_range: PixelRange, seed: int) -> None:
        self.resolution = resolution
        self.pixel_range: PixelRange = pixel_range
        self.seed = seed

    # subclasses provide these
    num_train: int
    num_held: int

    def _load(self, split: Literal["train", "held"], idx: list[int]) -> tuple[Tensor, list[str]]:
        """Items `idx` of a split as ((B, 3, R, R) uint8 in 0..255 or float32 in [0, 1], captions).

        Stored images stay uint8 until they reach the device: a quarter of the bytes to pin and copy.
        """
        raise NotImplementedError

    def load_train(self, idx: list[int]) -> tuple[Tensor, list[str], list[str]]:
        """Training items for the loader: (images as `_load` gives them, captions, files skipped).

        Sources that decode files per batch replace a file that fails to decode by the next item and
        name it in the third element; the trainer counts them (see loader.SkipCounter).
        """
        images, captions = self._load("train", idx)
        return images, captions, []

    def _render(self, split: Literal["train", "held"], idx: list[int]) -> tuple[Tensor, list[str]]:
        """Items `idx` of a split as ((B, 3, R, R) float32 in [0, 1], captions)."""
        images, captions = self._load(split, idx)
        return as_unit_float(images), captions

    def edit_pairs(self, n: int) -> list[tuple[str, str]]:
        """n (caption, edited caption) pairs that differ in exactly one attribute."""
        raise NotImplementedError

    def caption_words(self) -> list[str]:
        """Every word any caption or edit of this dataset can contain (sorted): the learned vocabulary."""
        raise NotImplementedError

    @property
    def supports_edits(self) -> bool:
        return True

    # -- public API

    def train_batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, list[str]]:
        """A random training batch drawn (with replacement) with `generator` (a CPU generator), for tests and
        tools: the trainer draws through model/data/loader.py, where a batch is a function of (seed, step).

        Returns (B, 3, R, R) float32 in the spec's pixel range and B captions.
        """
        if generator.device.type != "cpu":
            raise ValueError(f"train_batch needs a CPU torch.Generator (data is drawn on CPU), not {generator.device}")
        idx = torch.randint(self.num_train, (batch_size,), generator=generator).tolist()
        images, captions = self._render("train", idx)
        return from_unit(images, self.pixel_range), captions

    def held_out(self, n: int) -> tuple[Tensor, list[str]]:
        """The first n held-out items (always the same, never trained on), in the spec's pixel range."""
        if n > self.num_held:
            raise DatasetError(
                f"{n} held-out images requested but the {self.name} dataset keeps {self.num_held}: "
                f"raise data.held_out to at least {n} or lower eval.num_samples"
            )
        images, captions = self._render("held", list(range(n)))
        return from_unit(images, self.pixel_range), captions

    def sample_images(self, n: int, seed: int) -> Tensor:
        """n training images chosen by `seed` (without replacement where possible), in the pixel range.

        For statistics over the data such as AsymFlow's patch PCA basis.
        """
        g = torch.Generator().manual_seed(seed)
        if n <= self.num_train:
            idx = torch.randperm(self.num_train, generator=g)[:n].tolist()
        else:
            idx = torch.randint(self.num_train, (n,), generator=g).tolist()
        images, _ = self._render("train", idx)
        return from_unit(images, self.pixel_range)

    def to_unit(self, images: Tensor) -> Tensor:
        return to_unit(images, self.pixel_range)

    def to_lpips(self, images: Tensor) -> Tensor:
        return to_lpips(images, self.pixel_range)

    def from_unit(self, images: Tensor) -> Tensor:
        return from_unit(images, self.pixel_range)

    def __len__(self) -> int:
        return self.num_train
