"""A metric series as the detector reads it, kept up to date one checkpoint at a time.

The detector judges every new checkpoint on the series up to it: the best value so far, the one before,
how long the metric has been worsening, the control arm's best up to the step. Recomputed from the whole
series at each checkpoint, a reply of n checkpoints took n^2 time; carried along here, each checkpoint
costs O(1) per metric (the control's best, O(log n)), so a long reply or a long run is linear.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from orchestrator.numbers import is_finite
from orchestrator.runs.metric_ranges import comparable

if TYPE_CHECKING:
    from orchestrator.runs.checkpoint import Checkpoint

Direction = Literal["min", "max"]


def worse(a: float, b: float, direction: Direction) -> float:
    """How much worse a is than b (positive = worse), in metric units."""
    return a - b if direction == "min" else b - a


@dataclass
class _Track:
    """One metric of a series, in step order: its best finite value so far (the earliest on ties) and the
    one before the newest checkpoint, and how many of its latest finite values each got worse than the
    one before (missing values skipped). Updated per checkpoint in O(1)."""

    name: str
    direction: Direction
    best: tuple[int, float] | None = None
    best_cp: Checkpoint | None = None
    before: tuple[int, float] | None = None  # the best over all but the newest checkpoint
    last: float | None = None
    run: int = 0

    def add(self, cp: Checkpoint) -> None:
        self.before = self.best
        v = cp.get(self.name)
        if not is_finite(v):
            return
        self.run = self.run + 1 if self.last is not None and worse(v, self.last, self.direction) > 0 else 0  # type: ignore[arg-type]
        self.last = v
        if self.best is None or worse(v, self.best[1], self.direction) < 0:  # type: ignore[arg-type]
            self.best, self.best_cp = (cp.step, v), cp  # type: ignore[assignment]


class Series:
    """An arm's checkpoints fed in step order, with what `judge` needs of each metric kept up to date, so
    judging every checkpoint of a long series costs linear time in all (a node's long reply included)."""

    def __init__(self) -> None:
        self.points: list[Checkpoint] = []
        self.standin = False  # any LPIPS so far from the random stand-in backbone
        self.standin_metrics: set[str] = set()  # distribution metrics measured so far with a stand-in extractor
        self._tracks: dict[tuple[str, Direction], _Track] = {}

    @property
    def now(self) -> Checkpoint:
        return self.points[-1]

    def add(self, cp: Checkpoint) -> None:
        if self.points and cp.step <= self.now.step:
            raise ValueError(f"checkpoints are fed in step order: {cp.step} after {self.now.step}")
        self.points.append(cp)
        self.standin = self.standin or cp.lpips_standin
        self.standin_metrics |= cp.standin_metrics
        for track in self._tracks.values():
            track.add(cp)

    def track(self, name: str, direction: Direction) -> _Track:
        """The metric's track; one asked for the first time is built from the points so far."""
        key = (name, direction)
        if key not in self._tracks:
            track = _Track(name, direction)
            for cp in self.points:
                track.add(cp)
            self._tracks[key] = track
        return self._tracks[key]


class ControlBests:
    """The control arm's best value of a metric up to any step, in O(log n) after one pass per metric.
    Only values within the metric's range count: a control's refused value never stops another arm.

    `untrusted`: why these values may not stop the arm judged (they came from a node that is neither the
    arm's own nor trusted by the operator), or None. Then a stall is a warning with the evidence, not a stop:
    an in-range lie from the control's node must not stop arms on other nodes."""

    def __init__(self, control: Sequence[Checkpoint], untrusted: str | None = None) -> None:
        self.untrusted = untrusted
        self.points = sorted(control, key=lambda cp: cp.step)
        self.steps = [cp.step for cp in self.points]
        self._prefix: dict[tuple[str, Direction], list[tuple[int, float] | None]] = {}

    def best(self, name: str, direction: Direction, upto: int) -> tuple[int, float] | None:
        key = (name, direction)
        if key not in self._prefix:
            track, prefix = _Track(name, direction), []
            for cp in self.points:
                value = cp.get(name)
                if value is None or comparable(name, value):
                    track.add(cp)
                prefix.append(track.best)
            self._prefix[key] = prefix
        i = bisect.bisect_right(self.steps, upto)
        return self._prefix[key][i - 1] if i else None


