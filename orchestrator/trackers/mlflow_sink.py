"""MLflow: the grid as a parent run, each arm a child run, through MlflowClient.

Where runs go is MLflow's own configuration: MLFLOW_TRACKING_URI (a server, or a file store such as
file:///srv/mlruns) and MLFLOW_EXPERIMENT_NAME (default "ablate"). Their artifacts go where that URI says
(`artifact_root`): a server or a file store keeps its own; a database store (sqlite:///srv/mlflow.db) gets the
folder `mlruns` beside its file, where MLflow's client alone would write ./mlruns in the controller's working
directory. A resumed run logs into the same MLflow
run (its id is kept in the database); samples are artifacts under samples/step_<step>/, logged as the
PNG files they are (nothing is decoded). Every event of an arm is its artifact events.json (the latest
also the tag ablate.last_event); the grid's parent run is terminated when the grid ends. The grid's effects
are the parent run's artifact effects.json (each comparison's interval, decision and what it covers),
rewritten after each look and at the end, and a tag per comparison (`ablate.effect.<arm>.vs.<other>.<which>
.<metric>`: "-0.0123 [-0.0201, -0.0045] better (k=3, n=256)") with `ablate.effects_at` saying when.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from orchestrator.trackers.base import GridEffects, GroupEnd, Opened, Point, Status, TrackedRun, png_files
from orchestrator.vocabulary import RunState, TrackerName

DEFAULT_EXPERIMENT = "ablate"
PARAM_VALUE_MAX = 6000  # MLflow's limit on a param's value
BATCH_MAX = 100  # params per log_batch (MLflow's limit); metrics go in batches of 1000
END_STATUS = {RunState.completed: "FINISHED", RunState.stopped: "KILLED", RunState.failed: "FAILED"}
EVENTS_ARTIFACT = "events.json"  # every event of the run, oldest first: [{"step", "kind", "message"}]
EFFECTS_ARTIFACT = "effects.json"  # the grid's effects: {"at", "columns", "rows": [{column: value}]}
_TAG_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]+")  # MLflow tag keys: letters, digits, _ - . / and spaces
# Stores whose server or folder holds the artifacts itself: the experiment is created with its own default.
SELF_STORING = frozenset({"http", "https", "file", "databricks", "databricks-uc", "uc"})
ARTIFACTS_FOLDER = "mlruns"  # beside a database store's file, as MLflow names its local folder


def artifact_root(tracking_uri: str, home: Path) -> str | None:
    """Where a new experiment's artifacts go for `tracking_uri`: None where the store decides (a server, a file
    store), `mlruns` beside a local SQLite file, else `home`/mlruns (a database on another host names no folder
    here). MLflow's client would put a database store's artifacts in ./mlruns of whatever folder it ran in."""
    scheme = urlparse(tracking_uri).scheme.split("+", 1)[0].lower()
    if scheme in SELF_STORING or not scheme:  # no scheme: a path, MLflow's file store
        return None
    if scheme == "sqlite":
        path = tracking_uri.split(":///", 1)[1] if ":///" in tracking_uri else ""
        if path and path != ":memory:":
            return (Path(path).expanduser().resolve().parent / ARTIFACTS_FOLDER).as_uri()
    return (home.expanduser().resolve() / ARTIFACTS_FOLDER).as_uri()


def effect_tag(row: dict[str, Any]) -> tuple[str, str]:
    """One comparison as a parent run's tag: its key names the arms and metric, its value the interval and
    the decision."""
    other, _, which = str(row["vs"]).partition(" (")
    key = ".".join(_TAG_UNSAFE.sub("_", str(part)) for part in (row["arm"], "vs", other, which.rstrip(")"),
                                                                  row["metric"]))  # fmt: skip

    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:+.4g}"

    value = (f"{num(row['diff'])} [{num(row['low'])}, {num(row['high'])}] {row['decision']} "
             f"(k={row['k']}, n={row['n'] if row['n'] is not None else '-'})")  # fmt: skip
    return f"ablate.effect.{key}"[:250], value[:PARAM_VALUE_MAX]


def flat_params(spec: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """The resolved spec as dotted params (model.size -> "tiny"); lists as JSON-ish text, cut to MLflow's limit."""
    out: dict[str, str] = {}
    for key, value in spec.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_params(value, name + "."))
        else:
            out[name] = str(value)[:PARAM_VALUE_MAX]
    return out


class MlflowSink:
    name = TrackerName.mlflow

    def __init__(self, home: Path) -> None:
        """`home`: the controller's folder, where a database store on another host gets its artifacts."""
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient()  # MLFLOW_TRACKING_URI, or MLflow's default
        self.home = home
        self._experiment_id: str | None = None
        self.runs: dict[int, str] = {}  # ablate run id -> MLflow run id

    def experiment_id(self) -> str:
        if self._experiment_id is None:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
            found = self.client.get_experiment_by_name(name)
            if found is None:
                where = artifact_root(self.client.tracking_uri, self.home)
                self._experiment_id = self.client.create_experiment(name, artifact_location=where)
            else:  # an experiment keeps the artifact location it was created with
                self._experiment_id = found.experiment_id
        return self._experiment_id

    def open(self, run: TrackedRun) -> Opened:
        from mlflow.entities import Param

        experiment = self.experiment_id()
        parent = run.group_id
        if parent is None:
            parent = self.client.create_run(
                experiment, run_name=run.grid_name, tags={"ablate.grid_id": str(run.grid_id)}
            ).info.run_id
        run_id = run.external_id
        if run_id is None:
            tags = {"mlflow.parentRunId": parent, "ablate.grid_id": str(run.grid_id), "ablate.run_id": str(run.run_id),
                    "ablate.arm": run.arm}  # fmt: skip
            run_id = self.client.create_run(experiment, run_name=run.arm, tags=tags).info.run_id
            params = [Param(k, v) for k, v in flat_params(run.spec).items()]
            for start in range(0, len(params), BATCH_MAX):
                self.client.log_batch(run_id, params=params[start : start + BATCH_MAX])
            self.client.log_dict(run_id, run.spec, "spec.json")
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.runs[run.run_id] = run_id
        return Opened(run_id, parent)

    def checkpoint(self, run_id: int, point: Point) -> None:
        from mlflow.entities import Metric

        mlflow_run = self.runs[run_id]
        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, point.step) for key, value in point.scalars.items()]
        for start in range(0, len(metrics), 1000):
            self.client.log_batch(mlflow_run, metrics=metrics[start : start + 1000])
        if point.images:
            with png_files(point.images) as folder:
                self.client.log_artifacts(mlflow_run, str(folder), f"samples/step_{point.step:07d}")
        from mlflow.entities import RunTag

        tags = {"ablate.judged_metric": point.judged_metric, **{f"ablate.{k}": v for k, v in point.labels.items()}}
        self.client.log_batch(mlflow_run, tags=[RunTag(k, v) for k, v in tags.items()])

    def status(self, run_id: int, status: Status) -> None:
        mlflow_run = self.runs[run_id]
        tags = {"ablate.state": status.state}
        if status.decision is not None:
            tags |= {
                "ablate.decision": status.decision,
                "ablate.decision_step": str(status.decision_step),
                "ablate.decision_reason": status.decision_reason or "",
            }
        if status.best_step is not None:
            tags |= {"ablate.best_step": str(status.best_step), "ablate.best_value": str(status.best_value)}
        if status.notes:
            tags["ablate.last_event"] = f"{status.notes[-1].kind}: {status.notes[-1].message}"[:PARAM_VALUE_MAX]
        from mlflow.entities import RunTag

        self.client.log_batch(mlflow_run, tags=[RunTag(k, v) for k, v in tags.items()])
        if status.notes:  # every event so far, rewritten whole: a restarted controller loses none of the list
            events = [{"step": n.step, "kind": n.kind, "message": n.message} for n in status.events]
            self.client.log_dict(mlflow_run, events, EVENTS_ARTIFACT)
        if status.ended:
            self.client.set_terminated(mlflow_run, status=END_STATUS.get(RunState(status.state), "FINISHED"))
            self.runs.pop(run_id, None)

    def close(self, run_id: int) -> None:
        self.runs.pop(run_id, None)  # nothing held open: each call is one request

    def finish_group(self, group: GroupEnd) -> None:
        """The grid's parent run: its end state as a tag, then terminated (FINISHED, KILLED or FAILED)."""
        from mlflow.entities import RunTag

        tags = [RunTag("ablate.state", group.state), RunTag("ablate.runs", group.counts)]
        self.client.log_batch(group.external_id, tags=tags)
        self.client.set_terminated(group.external_id, status=END_STATUS.get(RunState(group.state), "FINISHED"))

    def effects(self, table: GridEffects) -> str | None:
        """The grid's parent run gets effects.json and a tag per comparison (made now if no run of the grid
        made it: returned, so its runs open under it)."""
        from mlflow.entities import RunTag

        parent = table.group_id
        if parent is None:
            parent = self.client.create_run(self.experiment_id(), run_name=table.grid_name,
                                            tags={"ablate.grid_id": str(table.grid_id)}).info.run_id  # fmt: skip
        rows = table.row_dicts()
        self.client.log_dict(parent, {"at": table.at, "columns": list(table.columns), "rows": rows}, EFFECTS_ARTIFACT)
        tags = [RunTag("ablate.effects_at", table.at), *(RunTag(*effect_tag(row)) for row in rows)]
        for start in range(0, len(tags), BATCH_MAX):
            self.client.log_batch(parent, tags=tags[start : start + BATCH_MAX])
        return parent if table.group_id is None else None
