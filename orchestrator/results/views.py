"""A run, its metrics, its grid and a sweep as views (the `Public` models every reader shows): built from their
database rows (`from_attributes`), so a field is named once, in the row and in the model. `RunSummary.from_row`
is the one way a run becomes a view, for the API, the CLI, the dashboard and a sweep's metrics export alike.
(A "record" is something else: the metric dict a worker writes per checkpoint, worker/run_files.py.)"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model, field_validator

from model.flow_headline import HEADLINE
from model.spec import STANDIN
from orchestrator.db.models import METRIC_FIELDS, Grid, Metric, Run
from orchestrator.grids.night import PlanPublic
from orchestrator.results.judge import judge_metric
from orchestrator.results.reports.stats import value_of
from orchestrator.vocabulary import RentedState, SweepState


def _utc(value: datetime) -> datetime:
    """SQLite hands back naive datetimes; every stored time is UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


UTCDatetime = Annotated[datetime, AfterValidator(_utc)]


class Public(BaseModel):
    model_config = ConfigDict(from_attributes=True)


# One optional field per metric column, typed from the table, so a new metric column appears here by itself.
MetricValues: type[Public] = create_model(  # type: ignore[call-overload]
    "MetricValues",
    __base__=Public,
    **{name: (Metric.__table__.columns[name].type.python_type | None, None) for name in METRIC_FIELDS},
)


# best_checkpoint and checkpoint_dir are where the worker wrote them: on the node's disk, which a rented node
# takes with it. What outlives the node is in checkpoint storage (checkpoint_url) and a sweep's copy-back.
ON_NODE = ("a path on the disk of the node that ran it (`node`), not on the controller; "
           "the stored copy is under checkpoint_url")


class GridPublic(Public):
    id: int
    name: str
    control: str | None  # Grid.control_arm
    control_on_trusted: bool  # the control runs only on a trusted node
    source: str  # a GridSource
    seeds: int  # training seeds per arm (a deciding grid: the most any arm has so far)
    # A deciding grid's `decide` as submitted (grids/deciding.py DecideSpec); None: a fixed number of seeds.
    decide: dict[str, Any] | None = None
    created_at: datetime
    states: dict[str, int]  # number of runs per RunState

    @classmethod
    def from_row(cls, grid: Grid) -> Self:
        return cls.model_validate(grid)


class RunSummary(MetricValues):  # type: ignore[misc, valid-type]
    """A run with its latest checkpoint's metrics (all None before the first checkpoint)."""

    id: int
    grid_id: int
    position: int
    arm: str
    seed: int  # which replicate of its arm (0..grid.seeds-1)
    state: str  # a RunState
    stop_requested: bool
    decision: str | None  # a RunDecision
    decision_step: int | None
    decision_reason: str | None
    best_step: int | None
    best_value: float | None
    best_checkpoint: Annotated[str | None, Field(description=ON_NODE)]
    gpu_name: str | None
    node: Annotated[str | None, Field(description="the registered name of the node it last ran on")]
    retries: int
    error: str | None  # why it failed: the exception's type, message and innermost frame
    fallbacks: list[Any]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    latest_step: int | None = None
    # The flow headline (model/flow_headline.py): what the detector judges on the flow loss.
    val_flow_ivw: float | None = None
    val_flow_ivw_se: float | None = None
    # The metric the detector judges it on (results/judge.py): what `ablate status` leads with.
    judged_metric: str = "recon_lpips"

    @classmethod
    def from_row(cls, run: Run, latest: Metric | None) -> Self:
        """The run's row with `latest` (its newest checkpoint, or None) flattened in."""
        standin = latest is not None and latest.lpips_backbone == STANDIN
        out = cls.model_validate(run).model_copy(update={"judged_metric": judge_metric(run, standin)})
        if latest is None:
            return out
        metrics = {name: getattr(latest, name) for name in METRIC_FIELDS}
        headline = {name: value_of(latest, name) for name in (HEADLINE, f"{HEADLINE}_se")}
        return out.model_copy(update={"latest_step": latest.step, **metrics, **headline})


class GridDetail(GridPublic):
    overrides: dict[str, Any]
    trackers: list[str]  # the experiment trackers its runs are forwarded to
    runs: list[RunSummary]
    # The night plan as submitted, or as the launcher last redrew it (drawn_at); None when no node's GPUs
    # were known at submission.
    plan: PlanPublic | None = None

    @field_validator("trackers", mode="before")
    @classmethod
    def _no_trackers(cls, trackers: list[str] | None) -> list[str]:
        return trackers or []  # NULL in rows written before the column existed

    @classmethod
    def from_rows(cls, grid: Grid, latest: dict[int, Metric]) -> Self:
        """The grid with each run's newest checkpoint (`latest`: run id -> metric row)."""
        runs = [RunSummary.from_row(r, latest.get(r.id)) for r in grid.runs]
        return cls.model_validate(grid).model_copy(update={"runs": runs})


HIDDEN = "<hidden>"


def hide_env(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec with a command arm's `env` values replaced by HIDDEN (the names stay): an env var is where a
    researcher puts a WANDB_API_KEY, and a run is read without the token by default. The value is never
    echoed back, to anyone; it goes only to the node that runs the arm."""
    command = spec.get("command")
    if not isinstance(command, dict) or not isinstance(command.get("env"), dict):
        return spec
    return {**spec, "command": {**command, "env": dict.fromkeys(command["env"], HIDDEN)}}


def hide_grid_env(body: dict[str, Any]) -> dict[str, Any]:
    """A grid body (a schedule's) with each command arm's `env` values replaced by HIDDEN, as hide_env does
    for a run's spec: in a body a command arm is {"name", "code", "command", "env", ...}."""
    arms = body.get("arms")
    if not isinstance(arms, list):
        return body
    hidden = [{**arm, "env": dict.fromkeys(arm["env"], HIDDEN)} if isinstance(arm, dict) and isinstance(
        arm.get("env"), dict) else arm for arm in arms]  # fmt: skip
    return {**body, "arms": hidden}


class RunPublic(RunSummary):
    """Everything stored about a run, including the exact resolved spec it trains."""

    spec: dict[str, Any]
    gpu_index: str | None
    gpu_uuid: str | None
    checkpoint_dir: Annotated[str | None, Field(description=ON_NODE)]
    checkpoint_url: str | None  # its prefix in durable checkpoint storage
    nodes: list[str]  # every node it ran on, in order (more than one after a lost node)
    last_checkpoint_step: int | None
    versions: dict[str, Any]

    @field_validator("spec")
    @classmethod
    def _hide_env(cls, spec: dict[str, Any]) -> dict[str, Any]:
        return hide_env(spec)

    @field_validator("nodes", mode="before")
    @classmethod
    def _no_nodes(cls, nodes: list[str] | None) -> list[str]:
        return nodes or []  # NULL in rows written before the column existed


class MetricPublic(MetricValues):  # type: ignore[misc, valid-type]
    step: int
    created_at: datetime
    extra: dict[str, Any]


class RentedInstancePublic(Public):
    """An instance a sweep rented. Never carries an API key: the provider's key is not in the row."""

    provider: str
    instance_id: str
    offer_id: str | None
    gpu_name: str
    gpus: int
    price_per_hour: float  # what the provider bills for the whole node
    label: str
    node_name: str | None
    state: RentedState
    host_key: str | None  # SHA256 fingerprint pinned at first contact
    created_at: UTCDatetime
    destroy_confirmed_at: UTCDatetime | None
    last_error: str | None
    cost_so_far: float  # price x (create -> destroy confirmed, or now)
    destroy_unconfirmed: bool  # red: it may still bill


class SweepPublic(Public):
    id: int
    state: SweepState
    scheduled_for: UTCDatetime
    fired_at: UTCDatetime
    late: bool
    grid_id: int | None
    nodes: list[str]
    price_per_hour: float
    budget: float | None
    spend: float
    stop_reason: str | None
    error: str | None
    results_dir: str | None
    finished_at: UTCDatetime | None
    instances: list[RentedInstancePublic]  # what it rented (empty on registered nodes)
