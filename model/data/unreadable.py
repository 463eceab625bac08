"""One rule for images that cannot be read, whether found at start (decoded or header-checked) or
mid-run (a file that fails to decode in a loader worker), and in `ablate data prepare`.

An unreadable image is left out and named. Up to `limit` (data.max_unreadable) of the dataset's images
the run goes on; past it, it fails naming the first ten, since a folder that bad is usually the wrong
folder or a half-finished copy rather than a few damaged photos.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from model.data.base import DatasetError

SHOWN = 10  # names in an error and in the run's fallbacks; the run's unreadable.txt lists every one
LISTED_NAME = "unreadable.txt"  # beside the run's metrics.jsonl: every unreadable image, one per line


@dataclass
class Unreadable:
    """The distinct unreadable images of one dataset (insertion-ordered), checked against the limit.

    total: the images the dataset lists, readable or not (the share is of these). what: the dataset, for
    messages ("imagefolder /data/faces").
    """

    total: int
    limit: float
    what: str
    knob: str = "data.max_unreadable"  # what raises the limit, for the message
    names: dict[str, None] = field(default_factory=dict)  # an insertion-ordered set
    first_reason: str | None = None  # why the first one failed, when known (start-up and prepare)

    def add(self, names: Iterable[str], reason: str | None = None) -> None:
        """Count `names` (each once, however often drawn) and fail past the limit."""
        for name in names:
            self.names.setdefault(name, None)
            if reason is not None and self.first_reason is None:
                self.first_reason = reason
        self.check()

    def check(self) -> None:
        if self.count <= self.limit * self.total:
            return
        why = f"; the first: {self.first_reason}" if self.first_reason else ""
        raise DatasetError(
            f"{self.what}: {self.count} of {self.total} images are unreadable, more than {self.knob} "
            f"({self.limit:.1%}): {', '.join(self.first())}{why}. Fix or remove them, or raise {self.knob}"
        )

    def first(self) -> list[str]:
        return list(self.names)[:SHOWN]

    @property
    def count(self) -> int:
        return len(self.names)


def fallback_note(name: str) -> str:
    """The run's fallback for one unreadable image: one stable line per file, so a resumed run adds none twice."""
    return f"unreadable image left out: {name}"
