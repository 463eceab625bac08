"""Image-caption data for the DiT core.

Sources: procedural `shapes` (shapes.py) and scikit-learn `digits` (digits.py) for tests and the demo;
the researcher's images as a folder with captions.jsonl or Hugging Face metadata (folder.py), WebDataset
tar shards (tar.py) and prepared uint8 shards (prepared.py, written by prepare.py); what they share is in
captioned.py and base.py, the rule for unreadable images in unreadable.py. loader.py feeds the
trainer from worker processes. Every dataset hands out images in the spec's pixel range with one caption
each, a fixed held-out split disjoint from training, and single-attribute caption edits.
"""

from __future__ import annotations

from pathlib import Path

from model.data.base import (
    DatasetError,
    ImageCaptionDataset,
    NoEditsError,
    PixelRange,
    as_unit_float,
    from_unit,
    identity_draw,
    step_indices,
    to_lpips,
    to_unit,
    tokenize,
)
from model.data.digits import DigitsDataset
from model.data.folder import ImageFolderDataset, check_image, load_image
from model.data.prepared import PreparedDataset
from model.data.shapes import (
    COLOURS,
    EDIT_KINDS,
    POSITIONS,
    SHAPES,
    SIZES,
    ShapeAttrs,
    ShapesDataset,
    edit_attrs,
    render_shape,
    render_shapes,
    shape_attrs,
    signed_distance,
)
from model.data.tar import TarShardsDataset
from model.spec import ArmSpec

__all__ = [
    "COLOURS",
    "EDIT_KINDS",
    "POSITIONS",
    "SHAPES",
    "SIZES",
    "DatasetError",
    "DigitsDataset",
    "ImageCaptionDataset",
    "ImageFolderDataset",
    "NoEditsError",
    "PixelRange",
    "PreparedDataset",
    "ShapeAttrs",
    "ShapesDataset",
    "TarShardsDataset",
    "as_unit_float",
    "build_dataset",
    "check_image",
    "edit_attrs",
    "from_unit",
    "identity_draw",
    "load_image",
    "render_shape",
    "render_shapes",
    "shape_attrs",
    "signed_distance",
    "step_indices",
    "to_lpips",
    "to_unit",
    "tokenize",
]


def build_dataset(spec: ArmSpec, root: Path | None = None, pin: str | None = None) -> ImageCaptionDataset:
    """The dataset an arm trains on, at spec.resolution() (data.resolution or the size preset's).

    root: where data.path's directory is on this machine; given when the worker fetched data.url
    into its node's cache (worker/data_fetch.py), else data.path. pin: the sha256 of the prepared
    manifest the run started on (a resume); a prepared directory whose manifest differs is refused.
    """
    d = spec.data
    res = spec.resolution()
    split = d.dataset_seed()  # never the training seed: replicates must share the held-out images
    if d.dataset == "shapes":
        return ShapesDataset(res, d.pixel_range, split, d.num_images, d.held_out)
    if d.dataset == "digits":
        return DigitsDataset(res, d.pixel_range, split, d.held_out)
    if d.url is not None and root is None:
        raise DatasetError(f"data.url {d.url!r}: fetch it first (worker.data_fetch.fetch_prepared) and pass its root")
    root = root if root is not None else Path(d.path or "").expanduser()
    precomputed = d.text_encoder == "precomputed"
    if d.dataset == "imagefolder":
        return ImageFolderDataset(
            root,
            res,
            d.pixel_range,
            split,
            d.held_out,
            precomputed,
            caption_column=d.caption_column,
            max_unreadable=d.max_unreadable,
        )
    if d.dataset == "webdataset":
        return TarShardsDataset(
            root, res, d.pixel_range, split, d.held_out, precomputed, max_unreadable=d.max_unreadable
        )
    if d.dataset == "prepared":
        # data.url's copy was verified by its fetch moments ago, under the node's lock; data.path's is here
        return PreparedDataset(root, res, d.pixel_range, split, d.held_out, precomputed, pin=pin, verify=d.url is None)
    raise DatasetError(f"unknown data.dataset {d.dataset!r}")
