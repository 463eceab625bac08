"""A sweep's results onto the controller: every run's metrics as JSON, its checkpoints from durable
storage, or over SFTP from the node that ran it when storage holds none; the grid's report beside them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Event, Grid, Node
from orchestrator.db.session import session_scope
from orchestrator.fleet.errors import error_reason
from orchestrator.fleet.safe_fetch import fetch_tree
from orchestrator.fleet.shell import NodeShell
from orchestrator.results.reports.write import write_report
from orchestrator.results.views import MetricPublic, RunPublic
from orchestrator.runs.storage import copy_back_bytes, download_run


def copy_back(
    database_url: str,
    checkpoint_options: dict[str, Any],
    sweep_id: int,
    grid_id: int | None,
    names: list[str],
    results: Path,
    max_bytes: int | None,
    keep_last: int = 2,
) -> tuple[list[str], set[str]]:
    """Metrics from the DB to metrics.json; each run's checkpoints from durable storage, or from the
    node that ran it when storage holds none (or cannot be read). At most `max_bytes` per run (None: sized
    to the checkpoints the run keeps, `keep_last` of them and best.pt: runs/storage.py copy_back_bytes),
    and no link a node left is followed: what is refused is named in the problems."""
    problems: list[str] = []
    failed: set[str] = set()
    wanted: dict[str, list[tuple[str, Path, int]]] = {}  # node -> (its dir, local, most bytes)
    stored: list[tuple[str, Path, str | None, str | None, int]] = []  # url, local, owner node, its dir, most bytes
    with session_scope(database_url) as session:
        grid = session.get(Grid, grid_id) if grid_id is not None else None
        nodes = {n.name: n for n in session.scalars(select(Node).where(Node.name.in_(names)))}
        # The controller records the node it started each worker on (its name); a worker's own hostname
        # is the fallback for runs from before that (machines can share hostnames).
        aliases = {
            alias: name
            for name, n in nodes.items()
            for alias in (name, n.host, n.last_probe.get("hostname"))
            if alias
        }
        started_on = started_nodes(session, [r.id for r in grid.runs] if grid is not None else [])
        export = []
        for run in grid.runs if grid is not None else []:
            view = RunPublic.from_row(run, run.metrics[-1] if run.metrics else None)
            metrics = [MetricPublic.model_validate(m).model_dump(mode="json") for m in run.metrics]
            export.append({**view.model_dump(mode="json"), "metrics": metrics})
            owner = aliases.get(started_on.get(run.id, "")) or aliases.get(run.node or "")
            local = results / "runs" / f"{run.id}-{path_part(run.arm)}"
            most = max_bytes if max_bytes is not None else copy_back_bytes(run.spec, keep_last)
            if run.checkpoint_url:
                stored.append((run.checkpoint_url, local, owner, run.checkpoint_dir, most))
            elif owner and run.checkpoint_dir:
                wanted.setdefault(owner, []).append((run.checkpoint_dir, local, most))
        for n in nodes.values():
            session.expunge(n)
    (results / "metrics.json").write_text(
        json.dumps({"sweep_id": sweep_id, "grid_id": grid_id, "runs": export}, indent=1, default=str)
    )
    for url, local, owner, remote, most in stored:
        try:
            skipped: list[str] = []
            download_run(url, checkpoint_options, local, most, skipped)
            if skipped:
                problems.append(f"copying {url} from checkpoint storage refused {len(skipped)} files: "
                                + "; ".join(skipped[:10]))
        except Exception as exc:  # noqa: BLE001 - storage down or empty: the node may still have them
            if owner and remote:
                wanted.setdefault(owner, []).append((remote, local, most))
            if not isinstance(exc, FileNotFoundError):
                problems.append(f"copying {url} from checkpoint storage: {error_reason(exc)}")
    for name, copies in wanted.items():
        try:
            with NodeShell.open(nodes[name], database_url) as shell:
                for remote, local, most in copies:
                    fetch_tree(shell, remote, local, max_bytes=most)
        except Exception as exc:  # noqa: BLE001 - SFTP PermissionError, ENOSPC, SSHException: keep going
            failed.add(name)
            problems.append(f"copying results from {name}: {error_reason(exc)} (its files are kept on the node)")
    return problems, failed


def results_report(database_url: str, checkpoint_options: dict[str, Any], grid_id: int | None,
                   results: Path) -> str | None:  # fmt: skip
    """The grid's report beside the copied-back results (its samples read from storage); why it could not
    be written, or None. A report that fails leaves the results as they are: it is said, never a failed
    sweep (`ablate report` writes it again once the cause is fixed)."""
    if grid_id is None:
        return None
    try:
        with session_scope(database_url) as session:
            if (grid := session.get(Grid, grid_id)) is not None:
                write_report(session, grid, results / "report", checkpoint_options)
    except Exception as exc:  # noqa: BLE001 - whatever broke the report, the results stay
        return f"the report could not be written into {results / 'report'}: {error_reason(exc)}"
    return None


def started_nodes(session: Session, run_ids: list[int]) -> dict[int, str]:
    """Run id -> the node its latest worker was started on (the controller's "started" events)."""
    ips: dict[int, str] = {}
    if not run_ids:
        return ips
    events = session.scalars(
        select(Event).where(Event.run_id.in_(run_ids), Event.kind == "started").order_by(Event.id)
    )
    for event in events:
        if isinstance(event.data, dict) and event.data.get("node_name"):
            ips[event.run_id] = str(event.data["node_name"])  # type: ignore[index]
    return ips


def path_part(name: str) -> str:
    """A stored arm name as one safe path part (names from before arm names were restricted)."""
    part = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".")
    return part[:64] or "arm"
