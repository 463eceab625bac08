"""scikit-learn's 8x8 digits, upscaled: a second small offline dataset with one-word edits."""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from model.data.base import DatasetError, ImageCaptionDataset, PixelRange


class DigitsDataset(ImageCaptionDataset):
    """scikit-learn's 1797 8x8 digits, bicubically upscaled, white on black; captions "the digit 7".

    The held-out split is the first data.held_out items of a permutation seeded by data.seed.
    data.num_images does not apply (the set is fixed).
    """

    name = "digits"

    def __init__(self, resolution: int, pixel_range: PixelRange, seed: int, held_out: int) -> None:
        from sklearn.datasets import load_digits

        super().__init__(resolution, pixel_range, seed)
        digits = load_digits()
        images = torch.from_numpy(digits.images).float().div(16.0).unsqueeze(1)  # (N, 1, 8, 8) in [0, 1]
        labels = torch.from_numpy(digits.target).long()
        if held_out >= len(labels):
            raise DatasetError(f"data.held_out ({held_out}) must be smaller than the {len(labels)} digits")
        perm = torch.from_numpy(np.random.default_rng(seed).permutation(len(labels)))
        self._held, self._train = perm[:held_out], perm[held_out:]
        self._images, self._labels = images, labels
        self.num_train, self.num_held = len(self._train), held_out

    def _load(self, split: Literal["train", "held"], idx: list[int]) -> tuple[Tensor, list[str]]:
        rows = (self._train if split == "train" else self._held)[torch.tensor(idx, dtype=torch.long)]
        small = self._images[rows]
        if self.resolution == 8:
            big = small
        else:
            big = F.interpolate(small, size=(self.resolution, self.resolution), mode="bicubic", align_corners=False)
        images = big.clamp(0, 1).expand(-1, 3, -1, -1).contiguous()
        return images, [f"the digit {int(d)}" for d in self._labels[rows]]

    def edit_pairs(self, n: int) -> list[tuple[str, str]]:
        rng = np.random.default_rng([self.seed & 0xFFFFFFFF, 1])
        out = []
        for i in range(n):
            digit = int(self._labels[self._held[i % self.num_held]])
            other = (digit + 1 + int(rng.integers(9))) % 10  # any other digit
            out.append((f"the digit {digit}", f"the digit {other}"))
        return out

    def caption_words(self) -> list[str]:
        return sorted({"the", "digit"} | {str(d) for d in range(10)})
