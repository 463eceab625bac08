"""Request and response bodies of the REST API (Create bodies in, Public bodies out).

The Create bodies belong to the services that validate them (grids, nodes, sweeps) and are re-exported
here. Every Public body is built from its database row (`from_attributes`), so a field is named once:
in the row and in the model. The views themselves live in
`orchestrator/results/views.py`: `RunSummary.from_row` is the one way a run becomes a view, for the API,
the CLI, the dashboard and a sweep's metrics export alike.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator

from orchestrator.fleet.inventory import NodeCreate, NodeUpdate
from orchestrator.grids.night import PlanPublic
from orchestrator.grids.service import GridCreate
from orchestrator.grids.stopping import GridStopped, RunStopped
from orchestrator.results.curves_import import CurvesImport
from orchestrator.results.views import (
    GridDetail,
    GridPublic,
    MetricPublic,
    MetricValues,
    Public,
    RentedInstancePublic,
    RunPublic,
    RunSummary,
    SweepPublic,
    UTCDatetime,
    hide_grid_env,
)
from orchestrator.sweeps.schedules import ScheduleCreate
from orchestrator.vocabulary import NodeState

__all__ = [
    "ArmPublic",
    "CurvesImport",
    "EventPublic",
    "GridCreate",
    "GridCreated",
    "GridDetail",
    "GridPublic",
    "GridStopped",
    "Gpu",
    "Health",
    "MetricPublic",
    "MetricValues",
    "NodeCreate",
    "NodePublic",
    "NodeUpdate",
    "ProbeResult",
    "RentedInstancePublic",
    "RunPublic",
    "RunStopped",
    "RunSummary",
    "ScheduleCreate",
    "SchedulePublic",
    "SweepPublic",
]

RECENT_SWEEPS = 20  # how many of a schedule's sweeps its view shows, newest first


class GridCreated(BaseModel):
    id: int
    runs: int  # arms x seeds
    seeds: int
    # A rough projection (orchestrator/grids/replicates.py); None when a command arm cannot be projected.
    projected_gpu_hours: float | None
    cost: str  # the same in words, e.g. "2 arms x 3 seeds = 6 runs, about 1.2 GPU-hours (...)"
    # The night plan over the known nodes (orchestrator/grids/night.py); None: no node's GPUs are known.
    plan: PlanPublic | None = None
    # A deciding grid (`decide`): every comparison open to the budget, and the expected GPU-hours
    # (orchestrator/results/deciding/submit_cost.py decide_cost); None for a grid with fixed seeds or a command arm.
    worst_case_gpu_hours: float | None = None
    expected_gpu_hours: float | None = None
    # What was accepted but will not do what was asked, in words: a decided metric whose extractor weights are
    # not staged (orchestrator/grids/standin_decisions.py), so its nodes would measure it with a stand-in.
    warnings: list[str] = []


class ArmPublic(BaseModel):
    arm: str
    parent: str | None
    description: str
    changes: dict[str, Any]  # dotted field -> value where the arm differs from its parent
    spec: dict[str, Any]  # fully resolved


class Health(BaseModel):
    status: str
    database: str
    version: str  # as `ablate --version` says it (orchestrator/version.py): never a bare "unknown"


class Gpu(BaseModel):
    index: int
    name: str
    memory_mib: int
    driver: str
    uuid: str


class NodePublic(Public):
    id: int
    name: str
    host: str
    port: int
    user: str
    key_path: str
    known_hosts_path: str | None
    price_per_hour: float
    state: NodeState
    state_detail: str | None
    gpus: list[Gpu]
    declared_gpus: int | None  # the operator's count; the node uses the lower of this and its probe
    usable_gpus: int
    trusted: bool  # its values may stop arms on other nodes (docs/security.md)
    last_probe: dict[str, Any]
    created_at: UTCDatetime


class EventPublic(Public):
    """One event: what happened to a run, a grid, a sweep or a node. `node_id` is set on a node's own events
    (node.command, node.install_skipped, node.refused, ...); a run's start names its node in data.node_name."""

    id: int
    time: UTCDatetime
    kind: str
    message: str
    run_id: int | None
    grid_id: int | None
    node_id: int | None
    data: dict[str, Any]


class ProbeResult(BaseModel):
    node: str
    hostname: str
    gpus: list[Gpu]
    free_disk_gb: float
    python: str
    probed_at: str


class SchedulePublic(Public):
    id: int
    name: str
    cron: str
    grid: dict[str, Any]
    nodes: list[str]
    request: dict[str, Any] | None  # a NodeRequest: the nodes each sweep rents (then `nodes` is empty)
    budget: float | None
    misfire: str
    paused: bool
    last_fire_at: UTCDatetime | None
    next_fire_at: UTCDatetime | None
    created_at: UTCDatetime
    sweeps: list[SweepPublic] = Field(max_length=RECENT_SWEEPS)  # the most recent, newest first

    @field_validator("grid")
    @classmethod
    def _hide_env(cls, grid: dict[str, Any]) -> dict[str, Any]:
        return hide_grid_env(grid)  # the values go to the nodes of each sweep, never back to a reader

    @field_validator("sweeps", mode="before")
    @classmethod
    def _recent(cls, sweeps: Any) -> Any:
        return list(sweeps)[:RECENT_SWEEPS]
