"""SQLAlchemy 2 typed models. The schema changes only through Alembic revisions in migrations/."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    ColumnElement,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
    or_,
)
from sqlalchemy.ext.hybrid import hybrid_property
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from orchestrator.vocabulary import (
    ACTIVE_SWEEP_STATES,
    DETECTOR_STOPS,
    STOP_DECISIONS,
    EvaluationState,
    GridSource,
    NodeState,
    RentedState,
    RunState,
    SweepState,
)


def utcnow() -> datetime:
    return datetime.now(UTC)


def aware(t: datetime) -> datetime:
    """A stored time as UTC: SQLite hands timezone-aware columns back naive."""
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON, datetime: DateTime(timezone=True)}


class Grid(Base):
    __tablename__ = "grids"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    control_arm: Mapped[str | None] = mapped_column(String(64))
    overrides: Mapped[dict[str, Any]] = mapped_column(default=dict)
    source: Mapped[str] = mapped_column(String(32), default=GridSource.submitted)  # a GridSource
    # Training seeds per arm (replicates): each arm runs this many times on one fixed held-out split.
    seeds: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # TrackerNames its runs are forwarded to (orchestrator/trackers/); None on rows before 0009.
    trackers: Mapped[list[Any] | None] = mapped_column(default=list)
    # Its control arm runs only on a trusted node (the controller's machine or one marked `trusted`), so
    # the stall rule may stop the other arms on the control's values wherever they run.
    control_on_trusted: Mapped[bool] = mapped_column(default=False, server_default=false())
    # The night plan (orchestrator/grids/night.py PlanPublic), as submitted and as last redrawn by the
    # launcher; None: no node's GPUs were known, or a row before 0011.
    plan: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    # A deciding grid's `decide` (orchestrator/grids/deciding.py DecideSpec); None: a fixed number of seeds.
    # None is SQL NULL (not JSON null), so the decision pass finds the deciding grids with `IS NOT NULL`.
    decide: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True), default=None)

    runs: Mapped[list[Run]] = relationship(back_populates="grid", order_by="Run.position")

    @property
    def control(self) -> str | None:
        """The arm the stall rule compares against (the API's name for control_arm)."""
        return self.control_arm

    @property
    def states(self) -> dict[str, int]:
        """How many of its runs are in each RunState."""
        return dict(Counter(r.state for r in self.runs))


class Run(Base):
    """One arm of one grid, at one training seed (a grid with seeds N has N runs per arm)."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    grid_id: Mapped[int] = mapped_column(ForeignKey("grids.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer, default=0)  # order within the grid (FIFO)
    arm: Mapped[str] = mapped_column(String(64))
    # The replicate: which of the grid's training seeds (0..seeds-1); its spec's data.seed is the arm's
    # data.seed plus this, its data.split_seed the grid's one held-out split.
    seed: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    spec: Mapped[dict[str, Any]] = mapped_column()  # the resolved ArmSpec, exactly as trained
    state: Mapped[str] = mapped_column(String(16), default=RunState.queued, index=True)  # a RunState
    gpu_index: Mapped[str | None] = mapped_column(String(64))  # CUDA_VISIBLE_DEVICES the worker saw
    gpu_name: Mapped[str | None] = mapped_column(String(128))
    gpu_uuid: Mapped[str | None] = mapped_column(String(128))
    node: Mapped[str | None] = mapped_column(String(200))  # the registered name of the node it last ran on
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()
    retries: Mapped[int] = mapped_column(Integer, default=0)
    stop_requested: Mapped[bool] = mapped_column(default=False)
    checkpoint_dir: Mapped[str | None] = mapped_column(Text)  # on the node that runs it
    # Its prefix in durable checkpoint storage (ABLATE_CHECKPOINT_URL): outlives the node.
    checkpoint_url: Mapped[str | None] = mapped_column(Text)
    # Every node it ran on, in order (a lost node's run resumes on another); None on rows before 0003.
    nodes: Mapped[list[Any] | None] = mapped_column(default=list)
    last_checkpoint_step: Mapped[int | None] = mapped_column(Integer)
    best_step: Mapped[int | None] = mapped_column(Integer)
    best_value: Mapped[float | None] = mapped_column(Float)
    best_checkpoint: Mapped[str | None] = mapped_column(Text)
    decision: Mapped[str | None] = mapped_column(String(16))  # a RunDecision
    decision_step: Mapped[int | None] = mapped_column(Integer)
    decision_reason: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    # What the run could not do as asked and did instead (fp8 -> bf16 linears, compile off,
    # LPIPS stand-in backbone...), shown on the dashboard: never a silent degradation.
    fallbacks: Mapped[list[Any]] = mapped_column(default=list)
    # Code and library versions the worker ran with.
    versions: Mapped[dict[str, Any]] = mapped_column(default=dict)

    grid: Mapped[Grid] = relationship(back_populates="runs")
    metrics: Mapped[list[Metric]] = relationship(back_populates="run", order_by="Metric.step")

    @hybrid_property
    def being_stopped(self) -> bool:
        """The user or the detector wants this run stopped: it must never be (re)launched."""
        return bool(self.stop_requested) or self.decision in STOP_DECISIONS

    @being_stopped.inplace.expression
    @classmethod
    def _being_stopped_expression(cls) -> ColumnElement[bool]:
        return or_(cls.stop_requested.is_(True), cls.decision.in_(STOP_DECISIONS))

    def stop_reason(self, default: str = "stopped by the user") -> str:
        """Why the run is being stopped: the detector's reason when it decided so, else `default`."""
        if self.decision in DETECTOR_STOPS and self.decision_reason:
            return self.decision_reason
        return default


class MetricColumns:
    """The metric columns of one checkpoint's measurement: a training record's (Metric) and an evaluation's
    of the same checkpoint on more images (EvaluationResult), so the report reads either the same way."""

    train_loss: Mapped[float | None] = mapped_column(Float)
    grad_norm: Mapped[float | None] = mapped_column(Float)
    lr: Mapped[float | None] = mapped_column(Float)
    recon_lpips: Mapped[float | None] = mapped_column(Float)
    recon_lpips_se: Mapped[float | None] = mapped_column(Float)
    recon_lpips_n: Mapped[int | None] = mapped_column(Integer)
    text_lpips: Mapped[float | None] = mapped_column(Float)
    text_lpips_se: Mapped[float | None] = mapped_column(Float)
    text_lpips_n: Mapped[int | None] = mapped_column(Integer)
    text_manip_delta: Mapped[float | None] = mapped_column(Float)
    text_manip_delta_se: Mapped[float | None] = mapped_column(Float)
    text_manip_delta_n: Mapped[int | None] = mapped_column(Integer)
    # velocity-space flow loss on the held-out images at 8 fixed times (model/evaluate.py): needs no
    # downloaded weights; its per-image values and per-time means are in extra
    val_flow_loss: Mapped[float | None] = mapped_column(Float)
    val_flow_loss_se: Mapped[float | None] = mapped_column(Float)
    val_flow_loss_n: Mapped[int | None] = mapped_column(Integer)
    iter_per_sec: Mapped[float | None] = mapped_column(Float)
    samples_per_sec: Mapped[float | None] = mapped_column(Float)
    tokens_per_sec: Mapped[float | None] = mapped_column(Float)
    peak_memory_gb: Mapped[float | None] = mapped_column(Float)
    wall_time_s: Mapped[float | None] = mapped_column(Float)
    gpu_hours: Mapped[float | None] = mapped_column(Float)
    # "alexnet" for real LPIPS; "random_standin" marks a metric from an untrained backbone.
    lpips_backbone: Mapped[str | None] = mapped_column(String(32))
    extra: Mapped[dict[str, Any]] = mapped_column(default=dict)


class Metric(MetricColumns, Base):
    """One checkpoint of one run. Unique per (run, step): a re-sent checkpoint never duplicates."""

    __tablename__ = "metrics"
    __table_args__ = (UniqueConstraint("run_id", "step", name="uq_metrics_run_step"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    run: Mapped[Run] = relationship(back_populates="metrics")


METRIC_FIELDS = tuple(
    c.name for c in Metric.__table__.columns if c.name not in {"id", "run_id", "step", "created_at", "extra"}
)


class Evaluation(Base):
    """A request to evaluate every run's stored checkpoint of a grid again on `images` held-out images
    (POST /api/grids/{id}/evaluations): one EvaluationResult per run, beside its training records."""

    __tablename__ = "evaluations"

    id: Mapped[int] = mapped_column(primary_key=True)
    grid_id: Mapped[int] = mapped_column(ForeignKey("grids.id", ondelete="CASCADE"), index=True)
    images: Mapped[int] = mapped_column(Integer)
    step: Mapped[str] = mapped_column(String(16))  # as asked: "final", "best" or a step number
    # Per-image metrics its jobs measure (grids/evaluations.py EVERY_METRIC, or the flow loss alone); None: all
    measures: Mapped[list[Any] | None] = mapped_column()
    state: Mapped[str] = mapped_column(String(16), default=EvaluationState.queued)  # an EvaluationState
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column()

    results: Mapped[list[EvaluationResult]] = relationship(back_populates="evaluation", order_by="EvaluationResult.id")


class DecisionLook(Base):
    """One look of a deciding grid (orchestrator/results/deciding/decider.py): after wave `wave` ended, each
    comparison's decision and the work it added, stored with that work in one commit, once per wave."""

    __tablename__ = "decision_looks"
    __table_args__ = (UniqueConstraint("grid_id", "wave", name="uq_decision_looks_grid_wave"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    grid_id: Mapped[int] = mapped_column(ForeignKey("grids.id", ondelete="CASCADE"), index=True)
    wave: Mapped[int] = mapped_column(Integer)  # 0: the grid's first min_seeds seeds
    comparisons: Mapped[list[Any]] = mapped_column(default=list)  # results/deciding/decider.py ComparisonLook, as JSON
    actions: Mapped[list[Any]] = mapped_column(default=list)  # what this look queued: {"action", "arms"...}
    final: Mapped[bool] = mapped_column(default=False)  # nothing open, or nothing left to add: no more looks
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class EvaluationResult(MetricColumns, Base):
    """One run's job of an evaluation (a worker on a node, placed like a run) and, once completed, what it
    measured: the same columns and `extra` as the run's Metric row of that step, never written over it."""

    __tablename__ = "evaluation_results"
    __table_args__ = (UniqueConstraint("evaluation_id", "run_id", name="uq_evaluation_results_evaluation_run"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    evaluation_id: Mapped[int] = mapped_column(ForeignKey("evaluations.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)  # the checkpoint evaluated
    state: Mapped[str] = mapped_column(String(16), default=EvaluationState.queued, index=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)  # a worker lost re-queues it with attempt + 1
    node: Mapped[str | None] = mapped_column(String(200))  # where the current attempt is placed
    error: Mapped[str | None] = mapped_column(Text)
    gpu_seconds: Mapped[float | None] = mapped_column(Float)  # the node's measured time times the job's GPUs
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column()  # the current attempt's placement, by the controller
    finished_at: Mapped[datetime | None] = mapped_column()

    evaluation: Mapped[Evaluation] = relationship(back_populates="results")
    run: Mapped[Run] = relationship()


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (Index("ix_events_run_time", "run_id", "time"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    grid_id: Mapped[int | None] = mapped_column(ForeignKey("grids.id", ondelete="CASCADE"))
    node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id", ondelete="SET NULL"))
    time: Mapped[datetime] = mapped_column(default=utcnow)
    # started, checkpoint, stopped, failed, resumed, decision, node.command, schedule.fired, ...
    kind: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]] = mapped_column(default=dict)


class TrackerRun(Base):
    """How far one run (or, with run_id None, its grid) has been forwarded to one experiment tracker.

    The cursor a restarted controller resumes from, so no point is sent twice: the last checkpoint step
    and event id forwarded. `external_id` is the tracker's own id (a W&B run id, an MLflow run id, a
    TensorBoard folder), so a resumed run continues the same tracker run. Never holds a key.
    """

    __tablename__ = "tracker_runs"
    __table_args__ = (UniqueConstraint("tracker", "grid_id", "run_id", name="uq_tracker_runs_tracker_grid_run"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    tracker: Mapped[str] = mapped_column(String(16))  # a TrackerName
    grid_id: Mapped[int] = mapped_column(ForeignKey("grids.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    external_id: Mapped[str | None] = mapped_column(String(255))
    step: Mapped[int | None] = mapped_column(Integer)  # the last checkpoint forwarded
    event_id: Mapped[int | None] = mapped_column(Integer)  # the last run event forwarded
    closed: Mapped[bool] = mapped_column(default=False)  # the run ended and its tracker run was finished
    failures: Mapped[int] = mapped_column(Integer, default=0)  # failed forwarding steps in a row
    last_error: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class Node(Base):
    """A rented GPU machine reached over SSH (known host keys only)."""

    __tablename__ = "nodes"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    host: Mapped[str] = mapped_column(String(255))
    port: Mapped[int] = mapped_column(Integer, default=22)
    user: Mapped[str] = mapped_column(String(64))
    key_path: Mapped[str] = mapped_column(Text)
    known_hosts_path: Mapped[str | None] = mapped_column(Text)
    price_per_hour: Mapped[float] = mapped_column(Float, default=0.0)
    state: Mapped[str] = mapped_column(String(32), default=NodeState.registered)  # a NodeState
    # What put it in that state when it is a failure: "join: exit 126".
    state_detail: Mapped[str | None] = mapped_column(Text)
    gpus: Mapped[list[Any]] = mapped_column(default=list)  # from the last probe
    last_probe: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # The operator's word: its values may stop arms on other nodes (the stall rule against its control).
    trusted: Mapped[bool] = mapped_column(default=False, server_default=false())
    # The GPUs the operator (or the rental) says it has; None: not declared, so it takes no arm.
    declared_gpus: Mapped[int | None] = mapped_column(Integer)

    @property
    def usable_gpus(self) -> int:
        """The GPUs it may use: the lower of its last probe (the node's own nvidia-smi, its word) and what
        the operator declared; none while nothing is declared."""
        return min(len(self.gpus or []), self.declared_gpus or 0)


class Schedule(Base):
    """A cron-triggered sweep: provision nodes, run a grid, copy results back, tear down."""

    __tablename__ = "schedules"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    cron: Mapped[str] = mapped_column(String(120))
    grid: Mapped[dict[str, Any]] = mapped_column()  # a grid body as POST /api/grids takes it
    nodes: Mapped[list[Any]] = mapped_column(default=list)  # node names; empty when it has a request
    # A NodeRequest (orchestrator/fleet/providers/request.py) as JSON: nodes rented at each fire.
    request: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    budget: Mapped[float | None] = mapped_column(Float)  # currency units: price per hour x hours
    misfire: Mapped[str] = mapped_column(String(16), default="run_once")  # run_once | skip
    paused: Mapped[bool] = mapped_column(default=False)
    last_fire_at: Mapped[datetime | None] = mapped_column()
    next_fire_at: Mapped[datetime | None] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    # Newest first; read-only here (a sweep is created by the runner with its schedule_id).
    sweeps: Mapped[list[Sweep]] = relationship(viewonly=True, order_by="Sweep.id.desc()")


class Sweep(Base):
    """One firing of a schedule: the nodes it provisioned, the grid it ran, what it cost, how it ended."""

    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(primary_key=True)
    schedule_id: Mapped[int] = mapped_column(ForeignKey("schedules.id", ondelete="CASCADE"), index=True)
    scheduled_for: Mapped[datetime] = mapped_column()  # the cron time this sweep belongs to
    fired_at: Mapped[datetime] = mapped_column()  # when it started; later than scheduled_for for a misfire
    late: Mapped[bool] = mapped_column(default=False)  # fired after the controller was down (misfire run_once)
    state: Mapped[str] = mapped_column(String(16), default=SweepState.provisioning, index=True)  # a SweepState
    grid_id: Mapped[int | None] = mapped_column(ForeignKey("grids.id", ondelete="SET NULL"))
    nodes: Mapped[list[Any]] = mapped_column(default=list)  # node names provisioned
    price_per_hour: Mapped[float] = mapped_column(Float, default=0.0)  # sum over its nodes, at fire time
    budget: Mapped[float | None] = mapped_column(Float)
    spend: Mapped[float] = mapped_column(Float, default=0.0)  # price_per_hour x hours since fired_at
    stop_reason: Mapped[str | None] = mapped_column(Text)  # why it stopped early (budget reached, ...)
    stop_requested_at: Mapped[datetime | None] = mapped_column()  # when its runs were asked to stop
    error: Mapped[str | None] = mapped_column(Text)  # the failing command and its output
    results_dir: Mapped[str | None] = mapped_column(Text)  # where checkpoints and metrics were copied
    finished_at: Mapped[datetime | None] = mapped_column()

    # What it rented (empty for a sweep on registered nodes), oldest first.
    instances: Mapped[list[RentedInstance]] = relationship(viewonly=True, order_by="RentedInstance.id")

    @hybrid_property
    def under_way(self) -> bool:
        """Not yet finished: the runner advances it, and its schedule cannot fire again or be deleted."""
        return self.state in ACTIVE_SWEEP_STATES

    @under_way.inplace.expression
    @classmethod
    def _under_way_expression(cls) -> ColumnElement[bool]:
        return cls.state.in_(ACTIVE_SWEEP_STATES)


class RentedInstance(Base):
    """One instance a sweep rented from a provider, from create until its destroy was confirmed.

    Its cost is price_per_hour x (destroy_confirmed_at or now - created_at), both on the runner's clock:
    what the provider bills from create until destroy, and what the sweep's spend sums. Never holds a key.
    """

    __tablename__ = "rented_instances"
    __table_args__ = (UniqueConstraint("provider", "instance_id", name="uq_rented_provider_instance"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    # SET NULL: a deleted schedule's sweeps go, the record of what was rented (and maybe still bills) stays.
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id", ondelete="SET NULL"), index=True)
    provider: Mapped[str] = mapped_column(String(32))
    instance_id: Mapped[str] = mapped_column(String(128))
    offer_id: Mapped[str | None] = mapped_column(String(128))
    gpu_name: Mapped[str] = mapped_column(String(128), default="")
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    price_per_hour: Mapped[float] = mapped_column(Float, default=0.0)  # what the provider bills, whole node
    label: Mapped[str] = mapped_column(String(64))  # ablate.<controller>.s<sweep>
    node_name: Mapped[str | None] = mapped_column(String(200))  # its row in `nodes` while it is a node
    state: Mapped[str] = mapped_column(String(16), default=RentedState.renting, index=True)  # a RentedState
    # The SSH host key pinned at first contact (SHA256 fingerprint), see docs/operations.md.
    host_key: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    destroy_confirmed_at: Mapped[datetime | None] = mapped_column()
    last_error: Mapped[str | None] = mapped_column(Text)

    def cost(self, now: datetime) -> float:
        """What it billed: price per hour x (create -> destroy confirmed, or `now` while it may still bill)."""
        end = self.destroy_confirmed_at or now
        created = self.created_at
        # SQLite hands back naive datetimes; every stored time is UTC.
        end, created = (t if t.tzinfo is not None else t.replace(tzinfo=UTC) for t in (end, created))
        return self.price_per_hour * max(0.0, (end - created).total_seconds()) / 3600

    @property
    def cost_so_far(self) -> float:
        return round(self.cost(utcnow()), 6)

    @property
    def destroy_unconfirmed(self) -> bool:
        """Red on the dashboard: its destroy was not confirmed, so it may still bill."""
        return self.state == RentedState.destroy_failed


class Installation(Base):
    """This installation's identity: one row (id 1). `controller_id` is the controller part of every rented
    instance's label, generated at first use (orchestrator/fleet/providers/identity.py), so two
    installations on one provider account never take each other's instances for their own."""

    __tablename__ = "installation"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    controller_id: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
