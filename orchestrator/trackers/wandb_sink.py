"""Weights & Biases: one W&B run per arm, the grid as its group, through the official `wandb` client.

W&B's own variables configure it on the controller: WANDB_PROJECT (default "ablate"), WANDB_ENTITY,
WANDB_MODE (offline writes runs under WANDB_DIR for `wandb sync`), WANDB_API_KEY or `wandb login`. A
resumed run continues the same W&B run (its id, kept in the database, with resume="allow"), and the
forwarder's cursor keeps its steps increasing, as W&B requires. Samples go as the PNG files they are
(`wandb.Image` of a path; W&B reads their pixels, which the forwarder bounded by the header's size).
Every event of an arm is the summary's `events` table (the latest also `last_event`). The grid's effects
(each comparison's interval, decision and what it covers) are the summary's `effects` table in every run of
the grid, replaced after each look and at the end (`effects_at` says which); a run already finished is
resumed for it and finished again as it ended.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from orchestrator.trackers.base import GridEffects, GroupEnd, Opened, Point, Status, TrackedRun, png_files
from orchestrator.vocabulary import RunState, TrackerName

DEFAULT_PROJECT = "ablate"
EVENT_COLUMNS = ("step", "kind", "message")  # the summary's `events` table: every event of the run


def group_name(run: TrackedRun) -> str:
    return f"{run.grid_name} (grid {run.grid_id})"


class WandbSink:
    name = TrackerName.wandb

    def __init__(self, default_dir: Path) -> None:
        import wandb

        self.wandb = wandb
        self.dir = os.environ.get("WANDB_DIR") or str(default_dir)  # where offline runs and W&B's logs go
        self.runs: dict[int, Any] = {}  # ablate run id -> wandb Run

    def open(self, run: TrackedRun) -> Opened:
        wandb_id = run.external_id or secrets.token_hex(6)  # W&B run ids: [a-z0-9], unique in the project
        handle = self._init(run, wandb_id, job_type="arm", tags=[f"grid-{run.grid_id}"],
                            config={**run.spec, "ablate": {"run_id": run.run_id, "grid_id": run.grid_id,
                                                           "arm": run.arm}})  # fmt: skip
        self.runs[run.run_id] = handle
        return Opened(wandb_id)

    def _init(self, run: TrackedRun, wandb_id: str, **more: Any) -> Any:  # noqa: ANN401 - a wandb Run
        """Start or resume W&B run `wandb_id` as `run`'s, in its grid's group."""
        Path(self.dir).mkdir(parents=True, exist_ok=True)
        return self.wandb.init(
            project=os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT,
            entity=os.environ.get("WANDB_ENTITY") or None,
            dir=self.dir,
            id=wandb_id,
            resume="allow",
            name=run.arm,
            group=group_name(run),
            allow_val_change=True,
            reinit="create_new",  # several arms at once in this one process
            # the controller's own machine stats and git state would be mistaken for the arm's
            settings=self.wandb.Settings(console="off", silent=True, x_disable_stats=True, disable_git=True),
            **more,
        )

    def checkpoint(self, run_id: int, point: Point) -> None:
        handle = self.runs[run_id]
        row: dict[str, Any] = dict(point.scalars)
        with png_files(point.images) as folder:  # log copies each file into the run's media before it returns
            for image in point.images:
                row["samples/" + image.name.removesuffix(".png")] = self.wandb.Image(str(folder / image.name),
                                                                                     caption=image.caption)
            handle.log(row, step=point.step)
        handle.summary.update({"judged_metric": point.judged_metric, **point.labels})  # labels: which extractor

    def status(self, run_id: int, status: Status) -> None:
        handle = self.runs[run_id]
        summary: dict[str, Any] = {"state": status.state}
        if status.decision is not None:
            summary |= {"decision": status.decision, "decision_step": status.decision_step,
                        "decision_reason": status.decision_reason}  # fmt: skip
        if status.best_step is not None:
            summary |= {"best_step": status.best_step, "best_value": status.best_value}
        if status.notes:
            summary["last_event"] = f"{status.notes[-1].kind}: {status.notes[-1].message}"
            # Every event so far, as one table replaced whole: a restarted controller loses none of the list.
            rows = [[n.step, n.kind, n.message] for n in status.events]
            summary["events"] = self.wandb.Table(columns=list(EVENT_COLUMNS), data=rows)
        handle.summary.update(summary)
        if status.ended:
            handle.finish(exit_code=1 if status.state == RunState.failed else 0)
            self.runs.pop(run_id, None)

    def close(self, run_id: int) -> None:
        handle = self.runs.pop(run_id, None)
        if handle is not None:
            handle.finish()

    def finish_group(self, group: GroupEnd) -> None:
        pass  # a W&B group is a label on its runs, not a run: nothing to finish

    def effects(self, table: GridEffects) -> str | None:
        """The grid's table in each of its runs' summary: a run this sink holds open gets it now, one that
        ended is resumed, given it and finished again (exit code 1 where the run failed)."""
        for run in table.runs:
            handle = self.runs.get(run.run_id)
            resumed = handle is None
            if resumed:
                handle = self._init(run, str(run.external_id))
            handle.summary.update({"effects": self.wandb.Table(columns=list(table.columns),
                                                               data=[list(r) for r in table.rows]),
                                   "effects_at": table.at})  # fmt: skip
            if resumed:
                handle.finish(exit_code=1 if run.run_id in table.failed else 0)
        return None
