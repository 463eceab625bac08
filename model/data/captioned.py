"""What the researcher's datasets share: a list of (image, caption, optional edit) entries, a seeded
held-out split, an optional in-memory uint8 cache, precomputed text embeddings and caption edits.

The sources differ only in where an entry's pixels come from: a file in a folder (folder.py), a member
of a tar shard (tar.py) or a row of a prepared shard (prepared.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from model.data.base import DatasetError, ImageCaptionDataset, NoEditsError, tokenize
from model.data.shapes import COLOURS
from model.data.unreadable import Unreadable
from model.spec import MAX_UNREADABLE

# resized images are kept in memory (uint8) up to this many bytes; above it they are decoded per batch
CACHE_BYTES = 1 << 30
# a training item that fails to decode mid-run is replaced by the next one; after this many in a row, give up
MAX_CONSECUTIVE_BAD = 64


@dataclass(frozen=True)
class Entry:
    where: str  # "captions.jsonl line 4", "metadata.csv row 2", "shard-00001.tar member 17.jpg": for messages
    caption: str
    edit: str | None = None


def _colour_swap(caption: str, salt: int) -> str | None:
    """The caption with its first colour word replaced by another colour, or None if it has none."""
    names = list(COLOURS)
    for m in re.finditer(r"[A-Za-z]+", caption):
        word = m.group(0)
        if word.lower() in COLOURS:
            others = [c for c in names if c != word.lower()]
            new = others[salt % len(others)]
            new = new.capitalize() if word[0].isupper() else new
            return caption[: m.start()] + new + caption[m.end() :]
    return None


class CaptionedDataset(ImageCaptionDataset):
    """Base of the folder, tar-shard and prepared datasets; subclasses give `_decode` and `_check`."""

    name = "captioned"
    listing = "captions.jsonl"  # what entries are aligned with, for embedding messages

    def _setup(
        self,
        root: Path,
        entries: list[Entry],
        held_out: int,
        needs_embeddings: bool,
        cache_bytes: int | None,
        embeddings_dir: Path | None = None,
        max_unreadable: float = MAX_UNREADABLE,
    ) -> None:
        """Cache or check, split, and load embeddings; called by subclasses once `entries` are known.

        An entry that cannot be read now is left out of both splits and named in `self.unreadable`; past
        `max_unreadable` of the entries this fails naming the first ten (model/data/unreadable.py).
        """
        self.root = root
        self.entries = entries
        # data.text_encoder == "precomputed": embeddings are required, and edits must have one too
        self._needs_embeddings = needs_embeddings
        n = len(entries)
        self.unreadable = Unreadable(n, max_unreadable, f"{self.name} {root}")

        # Within the cap every image is decoded now (and kept); above it each item is checked now (a
        # header) and the pixels are decoded per batch, so memory stays bounded whatever the dataset size.
        self._cache: Tensor | None = None
        bad: set[int] = set()
        cap = CACHE_BYTES if cache_bytes is None else cache_bytes  # read now, so a test can lower it
        cached = n * 3 * self.resolution * self.resolution <= cap
        images: list[Tensor] = []
        for r in range(n):
            try:
                if cached:
                    images.append(self._decode(r))
                else:
                    self._check(r)
            except DatasetError as exc:
                bad.add(r)
                self.unreadable.add([self.item_name(r)], reason=str(exc))
                if cached:  # a placeholder keeps cache rows aligned with entries; no split draws it
                    images.append(torch.zeros(3, self.resolution, self.resolution, dtype=torch.uint8))
        if cached:
            self._cache = torch.stack(images)
        readable = n - len(bad)
        if held_out >= readable:
            unread = f" ({len(bad)} unreadable)" if bad else ""
            raise DatasetError(
                f"data.held_out ({held_out}) must be smaller than the number of images ({readable}{unread}) in "
                f"{root}; lower data.held_out or add images"
            )
        # The permutation is of all entries, then the unreadable dropped: a folder without any keeps the
        # split it always had.
        perm = [r for r in np.random.default_rng(self.seed).permutation(n).tolist() if r not in bad]
        self._held, self._train = perm[:held_out], perm[held_out:]
        self.num_train, self.num_held = len(self._train), held_out
        self.text_embeddings = self._load_embeddings(embeddings_dir or root)
        if needs_embeddings and self.text_embeddings is None:
            raise DatasetError(
                f"data.text_encoder 'precomputed' needs {embeddings_dir or root}/embeddings.pt or embeddings.npy; "
                "add one or choose data.text_encoder learned or minilm"
            )

    def _decode(self, row: int) -> Tensor:
        """Entry `row` as (3, R, R) uint8; raises DatasetError naming it if it cannot be read."""
        raise NotImplementedError

    def _check(self, row: int) -> None:
        """A cheap check that entry `row` is readable (no pixels decoded); DatasetError if not."""
        raise NotImplementedError

    def item_name(self, row: int) -> str:
        """How the run names entry `row` when it is unreadable: the same at start, mid-run and after a resume."""
        return self.entries[row].where

    # -- pixels

    def _load(self, split: Literal["train", "held"], idx: list[int]) -> tuple[Tensor, list[str]]:
        rows = [(self._train if split == "train" else self._held)[i] for i in idx]
        if self._cache is not None:
            images = self._cache[torch.tensor(rows, dtype=torch.long)]
        else:
            images = torch.stack([self._decode(r) for r in rows])
        return images, [self.entries[r].caption for r in rows]

    def load_train(self, idx: list[int]) -> tuple[Tensor, list[str], list[str]]:
        """Training items; one that fails to decode is replaced by the next training item and named.

        The replacement depends only on the index, so a batch stays a pure function of (seed, step).
        """
        if self._cache is not None:
            images, captions = self._load("train", idx)
            return images, captions, []
        out, captions, skipped = [], [], []
        for i in idx:
            for k in range(MAX_CONSECUTIVE_BAD):
                row = self._train[(i + k) % self.num_train]
                try:
                    out.append(self._decode(row))
                except DatasetError:
                    skipped.append(self.item_name(row))
                    continue
                captions.append(self.entries[row].caption)
                break
            else:
                raise DatasetError(
                    f"{self.name} {self.root}: {MAX_CONSECUTIVE_BAD} consecutive training items fail to decode, "
                    f"e.g. {skipped[-1]}; check the files (ablate data prepare lists every unreadable one)"
                )
        return torch.stack(out), captions, skipped

    # -- text

    def _load_embeddings(self, where_dir: Path) -> dict[str, Tensor] | None:
        """Precomputed text embeddings, as caption -> (tokens, dim) float32.

        embeddings.pt: a dict {caption: Tensor (tokens, dim) or (dim,)} (edit captions may be included),
        or a Tensor (N, tokens, dim) / (N, dim) aligned with the entries (the lines of captions.jsonl).
        embeddings.npy: an array (N, tokens, dim) / (N, dim) aligned with the entries.
        A (dim,) vector counts as one token. Aligned arrays have no padding: every token is real.
        """
        pt, npy = where_dir / "embeddings.pt", where_dir / "embeddings.npy"
        if pt.is_file():
            try:
                data = torch.load(pt, map_location="cpu", weights_only=True)
            except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
                raise DatasetError(f"{pt} could not be loaded: {exc}") from None
            where = pt
        elif npy.is_file():
            try:
                data = torch.from_numpy(np.load(npy))
            except (OSError, ValueError) as exc:
                raise DatasetError(f"{npy} could not be loaded: {exc}") from None
            where = npy
        else:
            return None

        def tokens(t: Tensor, what: str) -> Tensor:
            if not isinstance(t, Tensor) or t.dim() not in (1, 2) or not t.is_floating_point():
                raise DatasetError(f"{where}: {what} must be a float tensor (tokens, dim) or (dim,)")
            return (t if t.dim() == 2 else t.unsqueeze(0)).float()

        if isinstance(data, dict):
            table = {str(k): tokens(v, f"entry {k!r}") for k, v in data.items()}
        elif isinstance(data, Tensor):
            if data.shape[0] != len(self.entries):
                raise DatasetError(
                    f"{where}: first dimension {data.shape[0]} != {len(self.entries)} lines of {self.listing}"
                )
            table = {e.caption: tokens(data[i], f"row {i}") for i, e in enumerate(self.entries)}
        else:
            raise DatasetError(f"{where}: expected a dict caption -> tensor or a tensor aligned with {self.listing}")
        missing = [e.caption for e in self.entries if e.caption not in table]
        if missing:
            raise DatasetError(f"{where}: no embedding for {len(missing)} caption(s), e.g. {missing[0]!r}")
        dims = {t.shape[-1] for t in table.values()}
        if len(dims) != 1:
            raise DatasetError(f"{where}: embeddings have different widths {sorted(dims)}")
        return table

    def _edit_candidates(self) -> list[tuple[str, str]]:
        """Edits from held-out entries first, then training ones: the "edit" field, else a colour-word swap.

        With precomputed embeddings only edits whose caption has an embedding qualify.
        """
        out = []
        for row in self._held + self._train:
            e = self.entries[row]
            edited = e.edit if e.edit is not None else _colour_swap(e.caption, row)
            if edited is None or edited == e.caption:
                continue
            if self._needs_embeddings and self.text_embeddings is not None and edited not in self.text_embeddings:
                continue
            out.append((e.caption, edited))
        return out

    @property
    def supports_edits(self) -> bool:
        return bool(self._edit_candidates())

    def edit_pairs(self, n: int) -> list[tuple[str, str]]:
        cands = self._edit_candidates()
        if not cands:
            extra = " whose edited caption also has a precomputed embedding" if self._needs_embeddings else ""
            raise NoEditsError(
                f"{self.name} {self.root}: no caption can be edited for text_manip_delta{extra}: add an "
                f'"edit" field (the caption with one attribute changed) to the entries of {self.listing}, '
                f"or use captions with a colour word ({', '.join(COLOURS)})"
            )
        return [cands[i % len(cands)] for i in range(n)]

    def caption_words(self) -> list[str]:
        words = set(COLOURS)  # colour-word swaps can introduce any of them
        for e in self.entries:
            words |= set(tokenize(e.caption))
            if e.edit:
                words |= set(tokenize(e.edit))
        return sorted(words)
