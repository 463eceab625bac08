"""Request and response bodies of the REST API (Create bodies in, Public bodies out)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, create_model

from orchestrator.db.models import METRIC_FIELDS, Metric
from orchestrator.grids import GridCreate

__all__ = [
    "ArmPublic",
    "GridCreate",
    "GridCreated",
    "GridDetail",
    "GridPublic",
    "Health",
    "MetricPublic",
    "MetricValues",
    "RunPublic",
    "RunSummary",
]


class Public(BaseModel):
    model_config = ConfigDict(from_attributes=True)


# One optional field per metric column, typed from the table, so a new metric column appears here by itself.
MetricValues: type[Public] = create_model(  # type: ignore[call-overload]
    "MetricValues",
    __base__=Public,
    **{name: (Metric.__table__.columns[name].type.python_type | None, None) for name in METRIC_FIELDS},
)


class GridCreated(BaseModel):
    id: int


class GridPublic(Public):
    id: int
    name: str
    control: str | None
    source: str
    created_at: datetime
    states: dict[str, int]  # number of runs per state


class RunSummary(MetricValues):  # type: ignore[misc, valid-type]
    """A run with its latest checkpoint's metrics (all None before the first checkpoint)."""

    id: int
    grid_id: int
    position: int
    arm: str
    state: str
    stop_requested: bool
    decision: str | None
    decision_step: int | None
    decision_reason: str | None
    best_step: int | None
    best_value: float | None
    best_checkpoint: str | None
    gpu_name: str | None
    node: str | None
    retries: int
    fallbacks: list[Any]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    latest_step: int | None


class GridDetail(GridPublic):
    overrides: dict[str, Any]
    runs: list[RunSummary]


class RunPublic(RunSummary):
    """Everything stored about a run, including the exact resolved spec it trains."""

    spec: dict[str, Any]
    gpu_index: str | None
    gpu_uuid: str | None
    checkpoint_dir: str | None
    checkpoint_url: str | None  # its prefix in durable checkpoint storage
    nodes: list[str]  # every node it ran on, in order (more than one after a lost node)
    last_checkpoint_step: int | None
    error: str | None
    versions: dict[str, Any]


class MetricPublic(MetricValues):  # type: ignore[misc, valid-type]
    step: int
    created_at: datetime
    extra: dict[str, Any]


class ArmPublic(BaseModel):
    arm: str
    parent: str | None
    description: str
    changes: dict[str, Any]  # dotted field -> value where the arm differs from its parent
    spec: dict[str, Any]  # fully resolved


class Health(BaseModel):
    status: str
    database: str
    version: str
