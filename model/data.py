"""Image-caption datasets for the DiT core: procedural `shapes`, scikit-learn `digits`, and `imagefolder`.

Every dataset hands out float32 images (B, 3, H, W) in the spec's pixel range ("unit" = [0, 1], the
study's arms A-E; "symmetric" = [-1, 1], arm F's fix) with one caption per image, a fixed held-out
split disjoint from training, and single-attribute caption edits for the text-manipulation metric.
Training batches are drawn with the trainer's torch.Generator, so a resumed run sees the same stream.
Nothing is downloaded: shapes are rendered, digits ship with scikit-learn, imagefolder is local.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from model.spec import ArmSpec

PixelRange = Literal["unit", "symmetric"]


class DatasetError(ValueError):
    """Bad dataset input (missing file, corrupt image, malformed captions.jsonl); the message names it."""


class NoEditsError(DatasetError):
    """No caption of the dataset admits a single-attribute edit, so text_manip_delta cannot be computed."""


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


# ---------------------------------------------------------------- the common interface


class ImageCaptionDataset:
    """Base of the three datasets: subclasses render items of the train / held-out split in [0, 1]."""

    name = "base"
    # caption -> (tokens, dim) float32 embeddings stored with the dataset (imagefolder only).
    text_embeddings: dict[str, Tensor] | None = None

    def __init__(self, resolution: int, pixel_range: PixelRange, seed: int) -> None:
        self.resolution = resolution
        self.pixel_range: PixelRange = pixel_range
        self.seed = seed

    # subclasses provide these
    num_train: int
    num_held: int

    def _render(self, split: Literal["train", "held"], idx: list[int]) -> tuple[Tensor, list[str]]:
        """Items `idx` of a split as ((B, 3, R, R) float32 in [0, 1], captions)."""
        raise NotImplementedError

    def edit_pairs(self, n: int) -> list[tuple[str, str]]:
        """n (caption, edited caption) pairs that differ in exactly one attribute."""
        raise NotImplementedError

    def caption_words(self) -> list[str]:
        """Every word any caption or edit of this dataset can contain (sorted): the learned vocabulary."""
        raise NotImplementedError

    @property
    def supports_edits(self) -> bool:
        return True

    # -- public API used by the trainer and the evaluator

    def train_batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, list[str]]:
        """A random training batch drawn (with replacement) with `generator` (a CPU generator).

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


# ---------------------------------------------------------------- shapes

COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.86, 0.12, 0.12),
    "green": (0.13, 0.70, 0.22),
    "blue": (0.15, 0.30, 0.90),
    "yellow": (0.97, 0.86, 0.15),
    "purple": (0.56, 0.22, 0.75),
    "orange": (0.98, 0.55, 0.10),
    "white": (0.96, 0.96, 0.96),
    "black": (0.06, 0.06, 0.06),
}
SHAPES = ("circle", "square", "triangle", "diamond", "cross", "ring")
SIZES = {"small": 0.13, "large": 0.22}  # half-extent as a fraction of the image side
POSITIONS = {  # centre (x, y) as fractions of the image side, y down
    "center": (0.5, 0.5),
    "top left": (0.28, 0.28),
    "top right": (0.72, 0.28),
    "bottom left": (0.28, 0.72),
    "bottom right": (0.72, 0.72),
}
EDIT_KINDS = ("colour", "shape", "background", "size", "position")


@dataclass(frozen=True)
class ShapeAttrs:
    """One shapes image: the captioned attributes plus small uncaptioned jitter (fractions, degrees)."""

    shape: str
    colour: str
    background: str
    size: str
    position: str
    dx: float = 0.0
    dy: float = 0.0
    scale: float = 1.0
    angle: float = 0.0

    def caption(self) -> str:
        article = "an" if self.background[0] in "aeiou" else "a"
        background = f"on {article} {self.background} background"
        return f"a {self.size} {self.colour} {self.shape} in the {self.position} {background}"


@functools.lru_cache(maxsize=1 << 16)
def shape_attrs(seed: int, index: int) -> ShapeAttrs:
    """The attributes of shapes item `index`, a pure function of (seed, index) (memoised: items repeat)."""
    rng = np.random.default_rng([seed & 0xFFFFFFFF, index])
    names = list(COLOURS)
    colour = names[rng.integers(len(names))]
    background = [c for c in names if c != colour][rng.integers(len(names) - 1)]
    return ShapeAttrs(
        shape=SHAPES[rng.integers(len(SHAPES))],
        colour=colour,
        background=background,
        size=list(SIZES)[rng.integers(len(SIZES))],
        position=list(POSITIONS)[rng.integers(len(POSITIONS))],
        dx=float(rng.uniform(-0.03, 0.03)),
        dy=float(rng.uniform(-0.03, 0.03)),
        scale=float(rng.uniform(0.92, 1.08)),
        angle=float(rng.uniform(-12, 12)),
    )


def edit_attrs(attrs: ShapeAttrs, kind: str, rng: np.random.Generator) -> ShapeAttrs:
    """`attrs` with exactly one captioned attribute (`kind`, one of EDIT_KINDS) changed; colour stays != background."""
    if kind == "colour":
        choices = [c for c in COLOURS if c not in (attrs.colour, attrs.background)]
        return replace(attrs, colour=choices[rng.integers(len(choices))])
    if kind == "background":
        choices = [c for c in COLOURS if c not in (attrs.colour, attrs.background)]
        return replace(attrs, background=choices[rng.integers(len(choices))])
    if kind == "shape":
        # ring vs circle differ only in the hole: still a visible, captioned change
        choices = [s for s in SHAPES if s != attrs.shape]
        return replace(attrs, shape=choices[rng.integers(len(choices))])
    if kind == "size":
        return replace(attrs, size="large" if attrs.size == "small" else "small")
    if kind == "position":
        choices = [p for p in POSITIONS if p != attrs.position]
        return replace(attrs, position=choices[rng.integers(len(choices))])
    raise ValueError(f"unknown edit kind {kind!r}; expected one of {EDIT_KINDS}")


def _sd_box(px: np.ndarray, py: np.ndarray, bx: float, by: float) -> np.ndarray:
    """Signed distance to an axis-aligned box with half-sizes (bx, by) (Quilez)."""
    qx, qy = np.abs(px) - bx, np.abs(py) - by
    outside = np.sqrt(np.maximum(qx, 0) ** 2 + np.maximum(qy, 0) ** 2)
    return outside + np.minimum(np.maximum(qx, qy), 0)


def _sd_triangle(px: np.ndarray, py: np.ndarray, r: float) -> np.ndarray:
    """Signed distance to an upward equilateral triangle with side 2r centred on its centroid (Quilez)."""
    k = math.sqrt(3.0)
    x = np.abs(px) - r
    y = -py + r / k  # image y points down; the formula has y up
    flip = (x + k * y) > 0
    x, y = np.where(flip, (x - k * y) / 2, x), np.where(flip, (-k * x - y) / 2, y)
    x = x - np.clip(x, -2 * r, 0)
    return -np.sqrt(x * x + y * y) * np.sign(y)


def signed_distance(shape: str, px: np.ndarray, py: np.ndarray, r: float) -> np.ndarray:
    """Signed distance (image-side units, negative inside) of `shape` with half-extent r at local coords (px, py)."""
    if shape == "circle":
        return np.sqrt(px * px + py * py) - r
    if shape == "ring":
        return np.abs(np.sqrt(px * px + py * py) - 0.75 * r) - 0.25 * r
    if shape == "square":
        return _sd_box(px, py, 0.85 * r, 0.85 * r)
    if shape == "diamond":
        c = math.sqrt(0.5)
        return _sd_box(c * (px + py), c * (py - px), 0.78 * r, 0.78 * r)
    if shape == "triangle":
        return _sd_triangle(px, py + 0.12 * r, 0.95 * r)  # nudge down: the centroid sits low in the box
    if shape == "cross":
        arm = 0.3 * r
        return np.minimum(_sd_box(px, py, r, arm), _sd_box(px, py, arm, r))
    raise ValueError(f"unknown shape {shape!r}")


def _coverage(shape: str, r: float, res: int, xs: np.ndarray, ys: np.ndarray, rot: tuple[float, float], tile: int):
    """Anti-aliased coverage (h, w) of a shape at offsets xs (w,), ys (h,) from its centre (image units).

    coverage = clamp(0.5 - distance_in_pixels, 0, 1): a one-pixel soft edge at any resolution. Above
    4 tiles a side, the distance is first taken at tile centres: every signed distance here is
    1-Lipschitz, so a tile whose centre lies deeper than its half-diagonal + 0.5 px is exactly all 0 or
    all 1, and only tiles along the edge are evaluated per pixel (about 5x fewer at 1024 px).
    """
    cos, sin = rot

    def alpha_at(ox: np.ndarray, oy: np.ndarray) -> np.ndarray:
        px, py = cos * ox + sin * oy, -sin * ox + cos * oy  # into the shape's frame
        return np.clip(0.5 - signed_distance(shape, px, py, r) * res, 0, 1).astype(np.float32)

    h, w = len(ys), len(xs)
    if min(h, w) < 4 * tile:
        return alpha_at(xs[None, :], ys[:, None])
    ny, nx = -(-h // tile), -(-w // tile)
    step = np.float32(1.0 / res)
    tx = (xs[0] + step * np.arange(nx * tile, dtype=np.float32)).reshape(nx, tile)  # padded to whole tiles
    ty = (ys[0] + step * np.arange(ny * tile, dtype=np.float32)).reshape(ny, tile)
    cx, cy = tx.mean(1), ty.mean(1)
    centre = signed_distance(shape, cos * cx[None, :] + sin * cy[:, None], -sin * cx[None, :] + cos * cy[:, None], r)
    centre = centre * res  # (ny, nx) in pixels
    margin = tile / math.sqrt(2) + 1.0
    alpha = np.zeros((ny, nx, tile, tile), dtype=np.float32)
    alpha[centre < -margin] = 1.0
    iy, ix = np.nonzero(np.abs(centre) <= margin)
    if len(iy):
        alpha[iy, ix] = alpha_at(tx[ix][:, None, :], ty[iy][:, :, None])  # (n_edge, tile, tile)
    return alpha.transpose(0, 2, 1, 3).reshape(ny * tile, nx * tile)[:h, :w]


def render_shape(attrs: ShapeAttrs, resolution: int, out: np.ndarray, tile: int = 16) -> None:
    """Draw one item into `out` ((3, R, R) float32, overwritten).

    Only the shape's bounding box is evaluated (every shape lies within ~1.1 r of its centre).
    """
    res = resolution
    cx = POSITIONS[attrs.position][0] + attrs.dx
    cy = POSITIONS[attrs.position][1] + attrs.dy
    r = SIZES[attrs.size] * attrs.scale
    bg = COLOURS[attrs.background]
    out[:] = np.asarray(bg, dtype=np.float32).reshape(3, 1, 1)
    reach = 1.15 * r + 1.0 / res
    x0, x1 = max(0, math.floor((cx - reach) * res)), min(res, math.ceil((cx + reach) * res))
    y0, y1 = max(0, math.floor((cy - reach) * res)), min(res, math.ceil((cy + reach) * res))
    if x0 >= x1 or y0 >= y1:
        return
    xs = (np.arange(x0, x1, dtype=np.float32) + 0.5) / res - np.float32(cx)
    ys = (np.arange(y0, y1, dtype=np.float32) + 0.5) / res - np.float32(cy)
    theta = math.radians(attrs.angle)
    rot = (np.float32(math.cos(theta)), np.float32(math.sin(theta)))
    alpha = _coverage(attrs.shape, r, res, xs, ys, rot, tile)
    for c, (f, b) in enumerate(zip(COLOURS[attrs.colour], bg, strict=True)):
        out[c, y0:y1, x0:x1] += np.float32(f - b) * alpha  # bg + (fg - bg) * alpha, one channel at a time


def render_shapes(attrs: list[ShapeAttrs], resolution: int, tile: int = 16) -> Tensor:
    """Render items as (B, 3, R, R) float32 in [0, 1]."""
    out = np.empty((len(attrs), 3, resolution, resolution), dtype=np.float32)
    for a, o in zip(attrs, out, strict=True):
        render_shape(a, resolution, o, tile)
    return torch.from_numpy(out)


class ShapesDataset(ImageCaptionDataset):
    """Procedural coloured shapes: item i is a pure function of (data.seed, i), rendered on demand.

    Training items are indices [0, num_images); held-out items follow them, so the splits are disjoint.
    """

    name = "shapes"

    def __init__(self, resolution: int, pixel_range: PixelRange, seed: int, num_images: int, held_out: int) -> None:
        super().__init__(resolution, pixel_range, seed)
        self.num_train, self.num_held = num_images, held_out

    def attrs(self, split: Literal["train", "held"], i: int) -> ShapeAttrs:
        return shape_attrs(self.seed, i if split == "train" else self.num_train + i)

    def _render(self, split: Literal["train", "held"], idx: list[int]) -> tuple[Tensor, list[str]]:
        attrs = [self.attrs(split, i) for i in idx]
        return render_shapes(attrs, self.resolution), [a.caption() for a in attrs]

    def edit_examples(self, n: int) -> list[tuple[ShapeAttrs, ShapeAttrs, str]]:
        """n (item, edited item, edit kind) from the held-out range on, cycling through EDIT_KINDS."""
        out = []
        for i in range(n):
            attrs = shape_attrs(self.seed, self.num_train + i)
            kind = EDIT_KINDS[i % len(EDIT_KINDS)]
            rng = np.random.default_rng([self.seed & 0xFFFFFFFF, self.num_train + i, 1])
            out.append((attrs, edit_attrs(attrs, kind, rng), kind))
        return out

    def edit_pairs(self, n: int) -> list[tuple[str, str]]:
        return [(a.caption(), e.caption()) for a, e, _ in self.edit_examples(n)]

    def caption_words(self) -> list[str]:
        words = {"a", "an", "in", "the", "on", "background"} | set(COLOURS) | set(SHAPES) | set(SIZES)
        words |= {w for p in POSITIONS for w in p.split()}
        return sorted(words)


# ---------------------------------------------------------------- digits


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

    def _render(self, split: Literal["train", "held"], idx: list[int]) -> tuple[Tensor, list[str]]:
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


# ---------------------------------------------------------------- imagefolder

# resized images are kept in memory (uint8) up to this many bytes; above it they are decoded per batch
_CACHE_BYTES = 1 << 30


@dataclass(frozen=True)
class FolderEntry:
    line: int  # 1-based line in captions.jsonl, for error messages
    file: Path
    caption: str
    edit: str | None


def load_image(path: Path, resolution: int, where: str = "") -> Tensor:
    """Decode an image file to (3, R, R) uint8: shorter side resized to R (bicubic, antialiased), centre-cropped.

    A missing or unreadable file raises DatasetError naming it.
    """
    from PIL import Image, UnidentifiedImageError

    if not path.is_file():
        raise DatasetError(f"imagefolder: image {path} does not exist{where}")
    try:
        with Image.open(path) as im:
            im = im.convert("RGB")
            w, h = im.size
            s = resolution / min(w, h)
            nw, nh = max(resolution, round(w * s)), max(resolution, round(h * s))
            im = im.resize((nw, nh), Image.Resampling.BICUBIC)
            left, top = (nw - resolution) // 2, (nh - resolution) // 2
            im = im.crop((left, top, left + resolution, top + resolution))
            arr = np.asarray(im, dtype=np.uint8)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise DatasetError(f"imagefolder: image {path} is corrupt or not an image{where}: {exc}") from None
    return torch.from_numpy(arr.copy()).permute(2, 0, 1)


def check_image(path: Path, where: str = "") -> None:
    """The file exists and its header is that of an image PIL can read (no pixels are decoded)."""
    from PIL import Image, UnidentifiedImageError

    if not path.is_file():
        raise DatasetError(f"imagefolder: image {path} does not exist{where}")
    try:
        with Image.open(path) as im:
            im.size  # noqa: B018 - parsed from the header
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise DatasetError(f"imagefolder: image {path} is corrupt or not an image{where}: {exc}") from None


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


class ImageFolderDataset(ImageCaptionDataset):
    """A directory of images plus captions.jsonl (one {"file", "caption", optional "edit"} object per line).

    Optional embeddings.pt / embeddings.npy hold precomputed text embeddings (see `_load_embeddings`).
    A missing file or one that is not an image fails at construction, before training. Images are
    decoded once and kept while the resized set fits `cache_bytes` (1 GiB), else decoded per batch.
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
        cache_bytes: int = _CACHE_BYTES,
    ) -> None:
        super().__init__(resolution, pixel_range, seed)
        self.root = root
        # data.text_encoder == "precomputed": embeddings are required, and edits must have one too
        self._needs_embeddings = needs_embeddings
        if not root.is_dir():
            raise DatasetError(f"data.path {root} is not a directory (expected images plus captions.jsonl)")
        self.entries = self._read_captions(root / "captions.jsonl")
        n = len(self.entries)
        if held_out >= n:
            raise DatasetError(
                f"data.held_out ({held_out}) must be smaller than the number of images ({n}) in {root}; "
                "lower data.held_out or add images"
            )
        perm = np.random.default_rng(seed).permutation(n).tolist()
        self._held, self._train = perm[:held_out], perm[held_out:]
        self.num_train, self.num_held = len(self._train), held_out

        # Within the cap every image is decoded now (and kept); above it each file's header is checked
        # now and the pixels are decoded per batch, so memory stays bounded whatever the dataset size.
        self._cache: Tensor | None = None
        if n * 3 * resolution * resolution <= cache_bytes:
            decoded = [load_image(e.file, resolution, f" (captions.jsonl line {e.line})") for e in self.entries]
            self._cache = torch.stack(decoded)
        else:
            for e in self.entries:
                check_image(e.file, f" (captions.jsonl line {e.line})")
        self.text_embeddings = self._load_embeddings()
        if needs_embeddings and self.text_embeddings is None:
            raise DatasetError(
                f"data.text_encoder 'precomputed' needs {root}/embeddings.pt or embeddings.npy; "
                "add one or choose data.text_encoder learned or minilm"
            )

    @staticmethod
    def _read_captions(path: Path) -> list[FolderEntry]:
        if not path.is_file():
            raise DatasetError(f"imagefolder: {path} is missing (one JSON object per line: file, caption)")
        entries = []
        for no, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path} line {no}: not valid JSON ({exc.msg})") from None
            if (
                not isinstance(obj, dict)
                or not isinstance(obj.get("file"), str)
                or not isinstance(obj.get("caption"), str)
            ):
                raise DatasetError(f'{path} line {no}: expected {{"file": "...", "caption": "..."}}')
            unknown = set(obj) - {"file", "caption", "edit"}
            if unknown:
                raise DatasetError(f"{path} line {no}: unknown key(s) {sorted(unknown)}; allowed: file, caption, edit")
            edit = obj.get("edit")
            if edit is not None and not isinstance(edit, str):
                raise DatasetError(f'{path} line {no}: "edit" must be a string (the edited caption)')
            entries.append(FolderEntry(no, path.parent / obj["file"], obj["caption"], edit))
        if not entries:
            raise DatasetError(f"{path} has no entries")
        return entries

    def _load_embeddings(self) -> dict[str, Tensor] | None:
        """Precomputed text embeddings, as caption -> (tokens, dim) float32.

        embeddings.pt: a dict {caption: Tensor (tokens, dim) or (dim,)} (edit captions may be included),
        or a Tensor (N, tokens, dim) / (N, dim) aligned with the lines of captions.jsonl.
        embeddings.npy: an array (N, tokens, dim) / (N, dim) aligned with the lines.
        A (dim,) vector counts as one token. Aligned arrays have no padding: every token is real.
        """
        pt, npy = self.root / "embeddings.pt", self.root / "embeddings.npy"
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
                    f"{where}: first dimension {data.shape[0]} != {len(self.entries)} lines of captions.jsonl"
                )
            table = {e.caption: tokens(data[i], f"row {i}") for i, e in enumerate(self.entries)}
        else:
            raise DatasetError(f"{where}: expected a dict caption -> tensor or a tensor aligned with captions.jsonl")
        missing = [e.caption for e in self.entries if e.caption not in table]
        if missing:
            raise DatasetError(f"{where}: no embedding for {len(missing)} caption(s), e.g. {missing[0]!r}")
        dims = {t.shape[-1] for t in table.values()}
        if len(dims) != 1:
            raise DatasetError(f"{where}: embeddings have different widths {sorted(dims)}")
        return table

    def _render(self, split: Literal["train", "held"], idx: list[int]) -> tuple[Tensor, list[str]]:
        rows = [(self._train if split == "train" else self._held)[i] for i in idx]
        if self._cache is not None:
            images = self._cache[torch.tensor(rows, dtype=torch.long)]
        else:
            images = torch.stack(
                [load_image(self.entries[r].file, self.resolution, f" (line {self.entries[r].line})") for r in rows]
            )
        return images.float().div(255.0), [self.entries[r].caption for r in rows]

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
                f"imagefolder {self.root}: no caption can be edited for text_manip_delta{extra}: add an "
                '"edit" field (the caption with one attribute changed) to lines of captions.jsonl, '
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


# ---------------------------------------------------------------- factory


def build_dataset(spec: ArmSpec) -> ImageCaptionDataset:
    """The dataset an arm trains on, at spec.resolution() (data.resolution or the size preset's)."""
    d = spec.data
    res = spec.resolution()
    if d.dataset == "shapes":
        return ShapesDataset(res, d.pixel_range, d.seed, d.num_images, d.held_out)
    if d.dataset == "digits":
        return DigitsDataset(res, d.pixel_range, d.seed, d.held_out)
    if d.dataset == "imagefolder":
        root = Path(d.path or "").expanduser()
        return ImageFolderDataset(root, res, d.pixel_range, d.seed, d.held_out, d.text_encoder == "precomputed")
    raise DatasetError(f"unknown data.dataset {d.dataset!r}")
