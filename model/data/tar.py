"""WebDataset tar shards: a directory of *.tar files whose members group by key (the basename up to its
first dot) into samples such as 000017.jpg + 000017.txt (or .json with a caption / text field).

Read with the standard library's tarfile, through an index of member offsets built once at start: the
trainer needs random access (step s's items are a pure function of the seed and s), which the
`webdataset` package's streaming pipeline does not give. The layout is the same, so shards written by
`webdataset.TarWriter` (or `tar` by hand) read as they are.
"""

from __future__ import annotations

import json
import os
import tarfile
from dataclasses import dataclass, replace
from pathlib import Path

from torch import Tensor

from model.data.base import DatasetError, PixelRange
from model.data.captioned import CaptionedDataset, Entry
from model.data.folder import decode_image
from model.spec import MAX_UNREADABLE

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
# A member's header says how large it is, and a shard of a few KB can claim gigabytes (a sparse member, or a
# size over the data that follows). Past these a sample is unreadable (data.max_unreadable), never read.
MAX_CAPTION_BYTES = 1 << 20  # a caption is a sentence; its .json a few hundred bytes
MAX_IMAGE_BYTES = 64 << 20  # a compressed training image; a 100-megapixel JPEG is ~30 MB


@dataclass(frozen=True)
class Member:
    shard: int  # index into TarIndex.shards
    offset: int  # of the member's data in the tar file
    size: int
    refused: str | None = None  # why the sample is unreadable without reading it (a sparse or oversized member)


def _refusal(info: tarfile.TarInfo, cap: int, where: str) -> str | None:
    if info.issparse():
        return f"{where} is a sparse member (claims {info.size} bytes); not read"
    if info.size > cap:
        return f"{where} claims {info.size} bytes, over the {cap} a sample's member may hold; not read"
    return None


def _split_key(name: str) -> tuple[str, str]:
    """WebDataset's rule: key = directory + basename up to the first dot; extension = the rest, lower-cased."""
    head, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{head}/{stem}" if head else stem), ext.lower()


def _caption_from(ext: str, data: bytes, where: str) -> tuple[str, str | None]:
    if ext == "txt":
        return data.decode("utf-8").strip(), None
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{where}: not valid JSON ({exc})") from None
    caption = obj.get("caption", obj.get("text")) if isinstance(obj, dict) else None
    if not isinstance(caption, str):
        raise DatasetError(f"{where}: expected a JSON object with a caption (or text) string")
    edit = obj.get("edit")
    return caption, edit if isinstance(edit, str) else None


def index_shards(root: Path) -> tuple[list[Path], list[Entry], list[Member]]:
    """Every sample with an image and a caption in root/*.tar (sorted by name), in shard order."""
    if not root.is_dir():
        raise DatasetError(f"data.path {root} is not a directory (expected WebDataset *.tar shards)")
    shards = sorted(root.glob("*.tar"))
    if not shards:
        raise DatasetError(f"webdataset: no *.tar shards in {root}")
    entries: list[Entry] = []
    members: list[Member] = []
    for s, path in enumerate(shards):
        images: dict[str, tuple[Member, str]] = {}
        captions: dict[str, tuple[str, str | None] | str] = {}  # a str alone: why the caption was refused
        order: list[str] = []
        try:
            with tarfile.open(path, "r:") as tf:
                for info in tf:
                    if not info.isfile():
                        continue
                    key, ext = _split_key(info.name)
                    where = f"{path.name} member {info.name}"
                    if ext in IMAGE_EXTS:
                        refused = _refusal(info, MAX_IMAGE_BYTES, where)
                        images[key] = (Member(s, info.offset_data, info.size, refused), info.name)
                        order.append(key)
                    elif ext in ("txt", "json"):
                        if (refused := _refusal(info, MAX_CAPTION_BYTES, where)) is not None:
                            captions[key] = refused
                            continue
                        fh = tf.extractfile(info)
                        assert fh is not None  # a regular file
                        captions[key] = _caption_from(ext, fh.read(), where)
        except (tarfile.TarError, OSError) as exc:
            raise DatasetError(f"webdataset: shard {path} cannot be read: {exc}") from None
        missing = [images[k][1] for k in order if k not in captions]
        if missing:
            raise DatasetError(
                f"webdataset: {path.name}: {len(missing)} image(s) without a .txt or .json caption, e.g. {missing[0]}"
            )
        for key in order:
            member, name = images[key]
            caption = captions[key]
            if isinstance(caption, str):  # its caption member was refused: the sample is unreadable
                member, caption = replace(member, refused=member.refused or caption), ("", None)
            entries.append(Entry(f"{path.name} member {name}", *caption))
            members.append(member)
    if not entries:
        raise DatasetError(f"webdataset: the shards in {root} hold no image with a caption")
    return shards, entries, members


class TarReader:
    """Reads members by offset with os.pread: no shared file position, so loader workers forked after
    the first read still read correctly."""

    def __init__(self, shards: list[Path]) -> None:
        self.shards = shards
        self._fds: dict[int, int] = {}

    def read(self, m: Member) -> bytes:
        if m.refused is not None:
            raise DatasetError(f"webdataset: {m.refused}")
        fd = self._fds.get(m.shard)
        if fd is None:
            fd = self._fds[m.shard] = os.open(self.shards[m.shard], os.O_RDONLY)
        data = os.pread(fd, m.size, m.offset)
        if len(data) != m.size:
            raise DatasetError(f"webdataset: {self.shards[m.shard].name} ends inside a member (truncated shard)")
        return data


class TarShardsDataset(CaptionedDataset):
    """WebDataset tar shards (data.dataset: webdataset)."""

    name = "webdataset"
    listing = "the shards' samples"

    def __init__(
        self,
        root: Path,
        resolution: int,
        pixel_range: PixelRange,
        seed: int,
        held_out: int,
        needs_embeddings: bool = False,
        cache_bytes: int | None = None,  # None: CACHE_BYTES
        max_unreadable: float = MAX_UNREADABLE,
    ) -> None:
        super().__init__(resolution, pixel_range, seed)
        shards, entries, self.members = index_shards(root)
        self.reader = TarReader(shards)
        self._setup(root, entries, held_out, needs_embeddings, cache_bytes, max_unreadable=max_unreadable)

    def _decode(self, row: int) -> Tensor:
        return decode_image(self.reader.read(self.members[row]), self.resolution, self.entries[row].where)

    def _check(self, row: int) -> None:
        """Members were listed by the index; their bytes are read and decoded per batch. One the index
        refused (sparse, oversized) is unreadable now."""
        if (refused := self.members[row].refused) is not None:
            raise DatasetError(f"webdataset: {refused}")
