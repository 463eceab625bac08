"""A folder of images with captions, in either of two layouts researchers already have:

- captions.jsonl: one {"file", "caption", optional "edit"} object per line (this project's own layout);
- the Hugging Face `imagefolder` layout: metadata.jsonl (one object per line) or metadata.csv, each with
  a `file_name` column and a caption column (data.caption_column, else the first of caption / text).

Images are decoded to (3, R, R) uint8: shorter side resized to R (bicubic, antialiased), centre-cropped.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from model.data.base import DatasetError, PixelRange, resolve_inside
from model.data.captioned import CaptionedDataset, Entry
from model.spec import MAX_UNREADABLE

LISTINGS = ("captions.jsonl", "metadata.jsonl", "metadata.csv")
CAPTION_COLUMNS = ("caption", "text")  # tried in this order when data.caption_column is not set
_DECODE_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError, SyntaxError)


def _unreadable_errors() -> tuple[type[BaseException], ...]:
    """What Pillow raises for a file that is not a usable image: its own errors, and DecompressionBombError
    (a header claiming over twice Image.MAX_IMAGE_PIXELS: decoding would take gigabytes), an unreadable file
    like any other."""
    from PIL import Image, UnidentifiedImageError

    return (UnidentifiedImageError, Image.DecompressionBombError, *_DECODE_ERRORS)


def decode_image(source: Path | bytes, resolution: int, name: str) -> Tensor:
    """Decode a file or its bytes to (3, R, R) uint8 (resize shorter side, centre crop); DatasetError naming it."""
    from PIL import Image

    try:
        with Image.open(source if isinstance(source, Path) else io.BytesIO(source)) as im:
            im = im.convert("RGB")
            w, h = im.size
            s = resolution / min(w, h)
            nw, nh = max(resolution, round(w * s)), max(resolution, round(h * s))
            im = im.resize((nw, nh), Image.Resampling.BICUBIC)
            left, top = (nw - resolution) // 2, (nh - resolution) // 2
            im = im.crop((left, top, left + resolution, top + resolution))
            arr = np.asarray(im, dtype=np.uint8)
    except _unreadable_errors() as exc:
        raise DatasetError(f"image {name} is corrupt or not an image: {exc}") from None
    return torch.from_numpy(arr.copy()).permute(2, 0, 1)


def load_image(path: Path, resolution: int, where: str = "") -> Tensor:
    """Decode an image file to (3, R, R) uint8. A missing or unreadable file raises DatasetError naming it."""
    if not path.is_file():
        raise DatasetError(f"imagefolder: image {path} does not exist{where}")
    try:
        return decode_image(path, resolution, str(path))
    except DatasetError as exc:
        raise DatasetError(f"imagefolder: {exc}{where}") from None


def check_image(path: Path, where: str = "") -> None:
    """The file exists and its header is that of an image PIL can read (no pixels are decoded)."""
    from PIL import Image

    if not path.is_file():
        raise DatasetError(f"imagefolder: image {path} does not exist{where}")
    try:
        with Image.open(path) as im:
            im.size  # noqa: B018 - parsed from the header
    except _unreadable_errors() as exc:
        raise DatasetError(f"imagefolder: image {path} is corrupt or not an image{where}: {exc}") from None


# ---------------------------------------------------------------- listings


def _jsonl(path: Path) -> Iterator[tuple[int, object]]:
    """(line number, parsed value) of each non-blank line; a line that is not JSON fails naming it."""
    for no, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            yield no, json.loads(raw)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path} line {no}: not valid JSON ({exc.msg})") from None


def _captions_jsonl(path: Path) -> list[tuple[Entry, Path]]:
    out = []
    for no, obj in _jsonl(path):
        if not isinstance(obj, dict) or not isinstance(obj.get("file"), str) or not isinstance(obj.get("caption"), str):
            raise DatasetError(f'{path} line {no}: expected {{"file": "...", "caption": "..."}}')
        unknown = set(obj) - {"file", "caption", "edit"}
        if unknown:
            raise DatasetError(f"{path} line {no}: unknown key(s) {sorted(unknown)}; allowed: file, caption, edit")
        edit = obj.get("edit")
        if edit is not None and not isinstance(edit, str):
            raise DatasetError(f'{path} line {no}: "edit" must be a string (the edited caption)')
        where = f"captions.jsonl line {no}"
        out.append((Entry(where, obj["caption"], edit), resolve_inside(path.parent, obj["file"], f"{path} line {no}")))
    return out


def _metadata_rows(path: Path) -> list[tuple[int, dict[str, object]]]:
    """(line or row number, object) of metadata.jsonl / metadata.csv (csv rows count from 2: line 1 is the header)."""
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as fh:
            return list(enumerate(csv.DictReader(fh), start=2))
    rows = []
    for no, obj in _jsonl(path):
        if not isinstance(obj, dict):
            raise DatasetError(f"{path} line {no}: expected a JSON object with file_name and a caption column")
        rows.append((no, obj))
    return rows


def _metadata(path: Path, caption_column: str | None) -> list[tuple[Entry, Path]]:
    """Hugging Face imagefolder metadata: file_name + a caption column; other columns are ignored (HF's
    layout carries arbitrary extra columns), an "edit" column is used when present."""
    rows = _metadata_rows(path)
    if not rows:
        return []
    columns = set(rows[0][1])
    if caption_column is not None:
        column = caption_column
    else:
        found = [c for c in CAPTION_COLUMNS if c in columns]
        if not found:
            raise DatasetError(
                f"{path}: no caption column ({' or '.join(CAPTION_COLUMNS)}) among {sorted(columns)}; "
                "set data.caption_column to the column that holds the captions"
            )
        column = found[0]
    out = []
    for no, obj in rows:
        what = f"line {no}" if path.suffix == ".jsonl" else f"row {no}"
        file, caption, edit = obj.get("file_name"), obj.get(column), obj.get("edit") or None
        if not isinstance(file, str) or not file:
            raise DatasetError(f"{path} {what}: missing file_name")
        if not isinstance(caption, str):
            raise DatasetError(f"{path} {what}: column {column!r} missing or not a string (data.caption_column)")
        if edit is not None and not isinstance(edit, str):
            raise DatasetError(f'{path} {what}: "edit" must be a string (the edited caption)')
        out.append((Entry(f"{path.name} {what}", caption, edit), resolve_inside(path.parent, file, f"{path} {what}")))
    return out


def read_listing(root: Path, caption_column: str | None = None) -> tuple[str, list[tuple[Entry, Path]]]:
    """The folder's listing file name and its (entry, image path) pairs; exactly one listing must exist."""
    if not root.is_dir():
        raise DatasetError(f"data.path {root} is not a directory (expected images plus captions.jsonl)")
    present = [name for name in LISTINGS if (root / name).is_file()]
    if not present:
        raise DatasetError(
            f"imagefolder: {root / 'captions.jsonl'} is missing (one JSON object per line: file, caption), and "
            "there is no Hugging Face metadata.jsonl or metadata.csv (file_name + caption column) either"
        )
    if len(present) > 1:
        raise DatasetError(
            f"imagefolder: {root} has {' and '.join(present)}; keep one listing so the captions are unambiguous"
        )
    name = present[0]
    if caption_column is not None and name == "captions.jsonl":
        raise DatasetError(
            "data.caption_column applies to metadata.jsonl / metadata.csv, not captions.jsonl; remove it"
        )
    pairs = _captions_jsonl(root / name) if name == "captions.jsonl" else _metadata(root / name, caption_column)
    if not pairs:
        raise DatasetError(f"{root / name} has no entries")
    return name, pairs


class ImageFolderDataset(CaptionedDataset):
    """A directory of images plus captions.jsonl, metadata.jsonl or metadata.csv.

    Optional embeddings.pt / embeddings.npy hold precomputed text embeddings (aligned with the listing).
    A missing file, or one that cannot be decoded (within the cache cap) or whose header is not an image
    (above it), is left out at construction; a file that passes the header check but fails to decode
    mid-run is replaced and counted. Both count against data.max_unreadable (model/data/unreadable.py).
    Images are decoded once and kept while the resized set fits `cache_bytes` (1 GiB), else per batch.
    """

    name = "imagefolder"

    def __init__(
        self,
        root: Path,
        resolution: int,
        pixel_range: PixelRange,
        seed: int,
        held_out: int,
        needs_embeddings: bool = False,
        cache_bytes: int | None = None,  # None: CACHE_BYTES
        caption_column: str | None = None,
        max_unreadable: float = MAX_UNREADABLE,
    ) -> None:
        super().__init__(resolution, pixel_range, seed)
        self.listing, pairs = read_listing(root, caption_column)
        self.files = [p for _, p in pairs]
        self._setup(root, [e for e, _ in pairs], held_out, needs_embeddings, cache_bytes, max_unreadable=max_unreadable)

    def _decode(self, row: int) -> Tensor:
        return load_image(self.files[row], self.resolution, f" ({self.entries[row].where})")

    def _check(self, row: int) -> None:
        check_image(self.files[row], f" ({self.entries[row].where})")

    def item_name(self, row: int) -> str:
        """The file as the listing names it, and where: "photos/x.jpg (metadata.jsonl line 602)"."""
        return f"{self.files[row].relative_to(self.root.resolve())} ({self.entries[row].where})"
