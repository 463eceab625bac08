"""What every tracker sink implements, and the frozen records the forwarder hands it.

The forwarder never knows which tracker it talks to (as a cloud's calling code never knows its provider):
each sink module (`tensorboard_sink.py`, `mlflow_sink.py`, `wandb_sink.py`) implements these few calls
with its tracker's official client, imported only when that tracker is named.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from orchestrator.vocabulary import TrackerName

TRACKER_EVENT = "tracker"  # the kind of a run's or grid's event about its forwarding (an outage, a refusal)
FIRST_RETRY_WAIT_S = 0.5  # between tries of one call: 0.5 s, 1 s, 2 s, ...; a paused run or grid: 1 s, 2 s, ...


@dataclass(frozen=True)
class TrackedRun:
    """One ablate run as a tracker run: the grid is the W&B group / MLflow parent run / TensorBoard folder,
    the arm the run's name, the resolved spec its config."""

    run_id: int
    arm: str
    grid_id: int
    grid_name: str
    spec: dict[str, Any]
    external_id: str | None  # the tracker's id of this run when it was opened before: resume it
    group_id: str | None  # the tracker's id of the grid (an MLflow parent run) when it was opened before


def tracked_name(arm: str, seed: int, seeds: int) -> str:
    """A run's name in a tracker: replicates of one arm are separate tracker runs, the arm and its seed."""
    return f"{arm}-s{seed}" if seeds > 1 else arm


@dataclass(frozen=True)
class Opened:
    """The ids a sink opened (or resumed) a run under, stored so the next controller resumes the same."""

    external_id: str
    group_id: str | None = None


@dataclass(frozen=True)
class SampleImage:
    """One sample PNG, checked (trackers/sample_images.py): a PNG within its arm's side, named once."""

    name: str  # the sample's file name (worker/run_files.py SAMPLE_FILE_RE)
    caption: str
    png: bytes


@contextmanager
def png_files(images: Sequence[SampleImage]) -> Iterator[Path]:
    """A temporary folder holding each image as the file `<name>` (removed after): for a client that takes
    files, so it is given the very bytes that were checked and decodes nothing it need not."""
    with tempfile.TemporaryDirectory(prefix="ablate-samples-") as folder:
        for image in images:
            (Path(folder) / image.name).write_bytes(image.png)
        yield Path(folder)


@dataclass(frozen=True)
class Point:
    """One checkpoint: its scalars (metrics with their SEs and n, throughput, the distribution metrics where
    the pass ran) at its step, the value of the metric the detector judged it on as `judged`, its sample images,
    and its labels: each distribution metric's extractor (`cmmd_extractor`: "... stand-in" where the features came
    from a random stand-in, so the tracker says so beside the metric)."""

    step: int
    scalars: dict[str, float]
    judged_metric: str
    images: tuple[SampleImage, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Note:
    """A run event (started, resumed, decision, stopped, ...) as text at a step."""

    kind: str
    message: str
    step: int


@dataclass(frozen=True)
class Status:
    """The run's state and the detector's word on it, as of now: a tag or summary on the tracker run."""

    state: str  # a RunState
    decision: str | None  # a RunDecision
    decision_step: int | None
    decision_reason: str | None
    best_step: int | None
    best_value: float | None
    judged_metric: str | None
    ended: bool  # a final state: the tracker run is finished after this
    notes: tuple[Note, ...] = field(default=())  # the run's events since the last status, oldest first
    events: tuple[Note, ...] = field(default=())  # every event of the run so far (the notes among them)


@dataclass(frozen=True)
class GroupEnd:
    """A grid whose runs all ended and were finished in the tracker: its own tracker run (an MLflow parent
    run) is finished now. `state` is a RunState for the whole grid (orchestrator/trackers/grid_end.py)."""

    grid_id: int
    external_id: str  # the tracker's id of the grid (Opened.group_id)
    state: str
    counts: str  # its runs' end states in words: "2 completed, 1 stopped"


@dataclass(frozen=True)
class GridEffects:
    """A grid's effects table (results/reports/tracker_table.py): each comparison's difference, 95% interval,
    decision and what the interval covers, as the report had it after a look or at the grid's end. W&B
    shows it in each run's summary, MLflow on the grid's parent run, TensorBoard as text in the grid's folder."""

    grid_id: int
    grid_name: str
    at: str  # "look 2", "final report (look 3)", "final report"
    step: int  # the look (1-based), 0 for a grid that does not decide: TensorBoard's step for the text
    columns: tuple[str, ...]  # arm, vs, metric, diff, low, high, k, n, decision, covers
    rows: tuple[tuple[Any, ...], ...]
    group_id: str | None  # the tracker's id of the grid (an MLflow parent run) when it was opened before
    runs: tuple[TrackedRun, ...] = ()  # the grid's runs this tracker opened (their external ids set)
    failed: frozenset[int] = frozenset()  # those that failed: a W&B run resumed to show the table ends failed

    def row_dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


class TrackerUnavailable(RuntimeError):
    """The tracker did not take what was sent (down, refusing, misconfigured); the forwarder retries later."""


class Sink(Protocol):
    """One tracker. Calls come from one forwarder thread at a time, for one run after another."""

    name: TrackerName

    def open(self, run: TrackedRun) -> Opened:
        """Start the tracker run, or resume it when `run.external_id` is set (W&B id + resume, the same
        MLflow run, the same TensorBoard folder); keep it open for the calls below."""
        ...

    def checkpoint(self, run_id: int, point: Point) -> None:
        """Log one checkpoint's scalars and images at its step."""
        ...

    def status(self, run_id: int, status: Status) -> None:
        """Record the state, the decision and its reason, and the notes; finish the run when it ended."""
        ...

    def close(self, run_id: int) -> None:
        """Let go of the run (flush), without marking it finished in the tracker (the controller stops)."""
        ...

    def finish_group(self, group: GroupEnd) -> None:
        """Finish the grid's own tracker run, when the sink opened one (`Opened.group_id`)."""
        ...

    def effects(self, table: GridEffects) -> str | None:
        """Show the grid's effects table (replacing the one shown before); returns the grid's tracker id
        where the sink opened one for it (an MLflow parent run when no run of the grid had made one)."""
        ...
