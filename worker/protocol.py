"""The node protocol: what a node's agent and the controller say to each other, written once for both ends.

The controller (orchestrator/fleet/agent_link.py) writes requests and reads replies through these models;
the node's agent (worker/agent.py) reads requests and its workers (worker/actor.py) write replies through
them. A node is a stranger: everything it sends is a claim the controller checks against these models
before it acts on it. docs/architecture.md, "The node protocol", walks through it.

One JSON object per line. Requests: {"id": n, "op": ..., ...} (`Request`); replies: {"id": n, "ok": true,
"result": {...}} or {"id": n, "ok": false, "error": "..."}. Ops and their results:

    hello                          Hello
    start  name, args (WorkerArgs) Started: the worker is created unless it exists (then adopted); with
           args.evaluation it evaluates a stored checkpoint again and trains nothing
    poll   runs {name: after}, wait_s   PollResult: each worker's WorkerReply, or WorkerLost
           (a worker whose reply is not ready within wait_s is left out and answered on a later poll)
    stop   name                    Found: a graceful stop (a final checkpoint) was asked
    kill   name                    Found: the worker ended at once
    ping   name                    WorkerInfo

Non-finite numbers travel as the strings "nan", "inf", "-inf" (`NONFINITE_TEXT`): strict JSON and Postgres
JSON have no token for them. `jsonable` writes them so; a record's typed metrics accept them.

Torch-free and Ray-free: a controller imports it without either. It uses pydantic, which a node has only
once its environment is installed: `python -m worker.agent --help` runs before, so the agent imports this
module where it handles a request, never at its own import.
"""

from __future__ import annotations

import math
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from model.command_spec import CommandEnd
from model.spec import MAX_REFERENCE_VALUES, ArmSpec, DistributionMetric
from worker.reference_keys import MAX_REFERENCES, ExtractorLabel, ReferenceKey, Sha256
from worker.run_files import RECORDS_PER_POLL
from worker.worker_names import ListedName, WorkerName

PROTOCOL = 2  # 2: a start request carries `args` (WorkerArgs), no longer `kwargs`
MAX_REQUEST_BYTES = 8 << 20  # a start request carries one arm's spec: a few KB
MAX_REPLY_BYTES = 16 << 20  # a poll's records: one line per checkpoint, a few KB each
MAX_STEP = 2**31 - 1  # a step the metrics table holds (a 32-bit column): far past any schedule


class Op(StrEnum):
    hello = "hello"
    start = "start"
    poll = "poll"
    stop = "stop"
    kill = "kill"
    ping = "ping"


# -- JSON values ---------------------------------------------------------------------------------------

NONFINITE_TEXT = ("nan", "inf", "-inf")  # a non-finite float on the wire and in JSON columns


def jsonable(value: Any) -> Any:
    """A record or reply as strict JSON: non-finite floats as their text (NONFINITE_TEXT), paths as strings,
    0-d tensors and numpy scalars as numbers, tuples as lists, keys as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan", "inf", "-inf"
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item):  # 0-d tensors / numpy scalars
        return jsonable(value.item())
    return value


_Step = Annotated[int, Field(ge=0, le=MAX_STEP)]
_Short = Annotated[str, Field(max_length=64)]
_Long = Annotated[str, Field(max_length=4000)]
Text = Annotated[str, Field(max_length=20_000)]
# A metric's value: a number, or a non-finite one as its text (a diverged loss).
Number = StrictFloat | Literal["nan", "inf", "-inf"]  # an integer is a float here too
Count = StrictInt
Path_ = Annotated[StrictStr, Field(max_length=4096)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- requests ------------------------------------------------------------------------------------------


PerImageMetric = Literal["recon_lpips", "text_lpips", "text_manip_delta", "val_flow_loss"]


MAX_BATCH = 256  # runs one evaluation worker may score in turn
EVALUATION_ERROR = "evaluation_error"  # a batched run's record: why its checkpoint could not be evaluated
# A training job's last record (EndEvaluation asked): its in-training evaluation's record, or why it failed.
IN_TRAINING_RECORD, IN_TRAINING_ERROR = "in_training_evaluation", "in_training_evaluation_error"


class BatchedRun(_Strict):
    """One more run an evaluation worker scores after loading its checkpoint in turn (EvaluationArgs.batch)."""

    run_id: Annotated[int, Field(ge=0)]
    spec: ArmSpec
    step: _Step
    source_dir: Path_
    storage: dict[str, Any] | None = None


class EvaluationArgs(_Strict):
    """A worker that evaluates one stored checkpoint again instead of training (worker/evaluation.py), or
    (`batch`) several runs' checkpoints of one evaluation in turn, with one start."""

    step: _Step  # the checkpoint evaluated; its record carries this step
    source_dir: Path_  # the run's directory (its checkpoints where this node holds them)
    images: Annotated[int, Field(ge=1, le=1_000_000)]  # the first N held-out images, each with its own seeded noise
    storage: dict[str, Any] | None = None  # the run's worker.checkpoint_store.StoreConfig: where else to find it
    samples: Annotated[int, Field(ge=8, le=4096)] | None = None  # distribution metrics' generated samples
    metrics: list[DistributionMetric] | None = None  # which (worker/distribution.py); None: not asked
    reference_pins: Annotated[dict[ReferenceKey, Sha256], Field(max_length=MAX_REFERENCES)] = {}  # key -> pinned sha
    # The per-image metrics to measure (model/evaluate.py); None: every one. Without an LPIPS metric, the flow
    # loss alone: no sampling.
    measures: Annotated[list[PerImageMetric], Field(min_length=1, max_length=4)] | None = None
    # Set: the runs this worker scores, each its own record naming its run_id (the args' own run among them)
    batch: Annotated[list[BatchedRun], Field(min_length=1, max_length=MAX_BATCH)] | None = None


class EndEvaluation(_Strict):
    """A deciding grid's run: at its last step its training job evaluates the kept checkpoint on `images` held-out
    images with the model still loaded (worker/evaluation.py evaluate_in_training), as an evaluation job would."""

    images: Annotated[int, Field(ge=1, le=1_000_000)]
    measures: Annotated[list[PerImageMetric], Field(min_length=1, max_length=4)] | None = None  # None: every one


class WorkerArgs(_Strict):
    """What a node builds a run's worker from (worker/actor.py ArmWorker's arguments)."""

    run_id: Annotated[int, Field(ge=0)]
    spec: ArmSpec  # validated here, once: the agent counts its GPUs and the worker trains it as it is
    out_dir: Path_  # checkpoints and records.jsonl of this run; the same directory across retries
    lpips_weights: Path_ | None = None  # local AlexNet weights for LPIPS (None: the spec decides)
    torch_threads: Annotated[int, Field(ge=0, le=4096)] = 0  # intra-op threads (0: torch's default)
    train_fn: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.]+:[A-Za-z0-9_]+$")] = "worker.train:train_arm"
    storage: dict[str, Any] | None = None  # worker.checkpoint_store.StoreConfig as a dict
    data_store: dict[str, Any] | None = None  # worker.data_fetch.DataStore as a dict
    code_archive: Path_ | None = None  # a command arm's code as shipped to this node (None: read in place)
    compile_cache: dict[str, Any] | None = None  # worker.compile_cache.CompileCache as a dict
    evaluation: EvaluationArgs | None = None  # set: evaluate a stored checkpoint, no training step
    end_evaluation: EndEvaluation | None = None  # set: a training job that evaluates its last checkpoint too


class OpRequest(_Strict):
    """What every request carries; each op's request below narrows `op` to its own."""

    id: int = 0  # set by the controller's link (fleet/agent_link.py), one per request; the reply echoes it
    op: Op


class HelloRequest(OpRequest):
    op: Literal[Op.hello] = Op.hello


class StartRequest(OpRequest):
    op: Literal[Op.start] = Op.start
    name: WorkerName
    args: WorkerArgs


class PollRequest(OpRequest):
    op: Literal[Op.poll] = Op.poll
    runs: Annotated[dict[WorkerName, _Step | None], Field(max_length=10_000)]  # name -> the last step taken
    wait_s: Annotated[float, Field(ge=0, le=600)] = 1.0


class StopRequest(OpRequest):
    op: Literal[Op.stop] = Op.stop
    name: WorkerName


class KillRequest(OpRequest):
    op: Literal[Op.kill] = Op.kill
    name: WorkerName


class PingRequest(OpRequest):
    op: Literal[Op.ping] = Op.ping
    name: WorkerName


Request = Annotated[
    HelloRequest | StartRequest | PollRequest | StopRequest | KillRequest | PingRequest, Field(discriminator="op")
]
REQUEST: TypeAdapter[Request] = TypeAdapter(Request)


# -- replies -------------------------------------------------------------------------------------------


class Hello(_Strict):
    protocol: Literal[PROTOCOL]  # type: ignore[valid-type]
    node: Annotated[str, Field(max_length=255)]
    gpus: Annotated[int, Field(ge=0, le=1024)]
    workers: Annotated[list[ListedName], Field(max_length=10_000)]


class Started(_Strict):
    adopted: bool  # the worker was there already (a controller restarted between start and its record)


class Found(_Strict):
    found: bool  # False: no such worker on the node (gone already)


class WorkerInfo(BaseModel):
    """Where a worker landed; stored on its run (other keys, such as provenance, are kept as data)."""

    model_config = ConfigDict(extra="allow")
    cuda_visible_devices: Annotated[str | None, Field(max_length=256)] = None
    pid: int | None = None
    node: Annotated[str | None, Field(max_length=255)] = None
    gpu_name: Annotated[str | None, Field(max_length=255)] = None
    gpu_uuid: Annotated[str | None, Field(max_length=128)] = None
    provenance: dict[str, Any] | None = None


# -- a record's lists: what a trainer writes per sample and per timestep (model/evaluate.py) -------------

MAX_EVAL_SAMPLES = 4096  # values per `*_samples` list and grid rows: model/spec.py EvalSpec.num_samples' bound
MAX_TIMESTEPS = 64  # timesteps of the held-out flow loss (model/evaluate.py VAL_TIMESTEPS is 8)
MAX_SKIPPED_NAMES = 64  # names in a record's skipped_files (the trainer sends the first 10)
SAMPLES_SUFFIX = "_samples"  # `<metric>_samples`: one value per held-out sample, any metric's
# Names the controller keeps in a stored record for its own bookkeeping (orchestrator/runs/ingest.py
# metric_values: the non-finite values SQLite cannot hold): a node's record never carries them.
CONTROLLER_FIELDS = ("nonfinite",)


def _rectangular(grid: list[list[Any]]) -> list[list[Any]]:
    if any(len(row) != len(grid[0]) for row in grid):
        raise ValueError("rows of different lengths (expected one row per sample, one value per timestep)")
    return grid


PerSample = Annotated[list[Number], Field(max_length=MAX_EVAL_SAMPLES)]  # sample i of every arm pairs up
PerReference = Annotated[list[Number], Field(max_length=MAX_REFERENCE_VALUES)]  # an MMD's, reference image a pairs
PerTimestep = Annotated[list[Number], Field(max_length=MAX_TIMESTEPS)]
FlowGrid = Annotated[list[PerTimestep], Field(max_length=MAX_EVAL_SAMPLES), AfterValidator(_rectangular)]
Timesteps = Annotated[list[Annotated[StrictFloat, Field(ge=0, le=1)]], Field(max_length=MAX_TIMESTEPS)]
FileNames = Annotated[list[Annotated[StrictStr, Field(max_length=4096)]], Field(max_length=MAX_SKIPPED_NAMES)]
# Each list field of a record and its declared shape: CheckpointRecord's fields below, and what a reader of
# stored records checks a list against (orchestrator/results/record_lists.py).
LIST_SHAPES: dict[str, Any] = {
    "recon_lpips_samples": PerSample,
    "text_lpips_samples": PerSample,
    "text_manip_delta_samples": PerSample,
    "val_flow_loss_samples": PerSample,
    "cmmd_per_reference": PerReference, "dino_mmd_per_reference": PerReference,  # model/distribution_pass.py
    "val_flow_loss_grid": FlowGrid,  # (sample x timestep) losses
    "val_flow_loss_by_t": PerTimestep,  # the grid's mean per timestep
    "val_flow_loss_t": Timesteps,  # the timesteps, in [0, 1]
    "skipped_files": FileNames,  # unreadable images left out (the first few)
}
PER_SAMPLE: TypeAdapter[list[Any]] = TypeAdapter(PerSample, config=ConfigDict(strict=True))


class CheckpointRecord(BaseModel):
    """One checkpoint's record (worker/train_record.py, or a command arm's metrics line) as it travels.

    The known fields are typed: each metric column of the controller's table (tests hold the two together),
    the per-sample and per-timestep lists a trainer writes (bounded in length, each value a number or the
    text of a non-finite one) and what ablate itself sets. A command arm's own metrics are extra fields, any
    JSON value, except that `<name>_samples` is a per-sample list and CONTROLLER_FIELDS are refused. What a
    value may be (its metric's range, a short list of notes) is the controller's check
    (orchestrator/runs/ingest.py)."""

    model_config = ConfigDict(extra="allow", strict=True)
    step: int  # past the run's last one and at most MAX_STEP: `refused_records`
    run_id: int | None = None
    train_loss: Number | None = None
    grad_norm: Number | None = None
    lr: Number | None = None
    recon_lpips: Number | None = None
    recon_lpips_se: Number | None = None
    recon_lpips_n: Count | None = None
    text_lpips: Number | None = None
    text_lpips_se: Number | None = None
    text_lpips_n: Count | None = None
    text_manip_delta: Number | None = None
    text_manip_delta_se: Number | None = None
    text_manip_delta_n: Count | None = None
    val_flow_loss: Number | None = None
    val_flow_loss_se: Number | None = None
    val_flow_loss_n: Count | None = None
    iter_per_sec: Number | None = None
    samples_per_sec: Number | None = None
    tokens_per_sec: Number | None = None
    peak_memory_gb: Number | None = None
    wall_time_s: Number | None = None
    gpu_hours: Number | None = None
    lpips_backbone: Annotated[str, Field(max_length=32)] | None = None  # "alexnet", or "random_standin"
    checkpoint: Path_ | None = None
    checkpoint_file: Path_ | None = None  # a command arm's own file under checkpoints/
    best_checkpoint: Path_ | None = None
    best_step: int | None = None
    is_best: StrictBool | None = None
    samples: dict[str, Any] | None = None  # the step's sample images (worker/samples.py)
    fallbacks: list[StrictStr] | None = None  # what the trainer did instead of what was asked
    # extractor label -> the sha256 of the reference features its distribution metrics were scored against
    distribution_sha256: Annotated[dict[ExtractorLabel, Sha256], Field(max_length=MAX_REFERENCES)] | None = None
    # the list fields, as LIST_SHAPES declares them (a test holds the two together)
    recon_lpips_samples: PerSample | None = None
    text_lpips_samples: PerSample | None = None
    text_manip_delta_samples: PerSample | None = None
    val_flow_loss_samples: PerSample | None = None
    cmmd_per_reference: PerReference | None = None
    dino_mmd_per_reference: PerReference | None = None
    val_flow_loss_grid: FlowGrid | None = None
    val_flow_loss_by_t: PerTimestep | None = None
    val_flow_loss_t: Timesteps | None = None
    skipped_files: FileNames | None = None

    @model_validator(mode="after")
    def _extra_names(self) -> CheckpointRecord:
        """A command arm's own fields: never the controller's bookkeeping; `<name>_samples` per sample."""
        for key, value in (self.model_extra or {}).items():
            if key in CONTROLLER_FIELDS:
                raise ValueError(f"{key} is the controller's own field: a record may not carry it")
            if key.endswith(SAMPLES_SUFFIX) and value is not None:
                try:
                    PER_SAMPLE.validate_python(value)
                except ValidationError as exc:
                    raise ValueError(f"{key} (a per-sample list): {first_error(exc)}") from None
        return self

    def values(self) -> dict[str, Any]:
        """The record as the worker sent it: the fields it set, its extra ones included."""
        return self.model_dump(exclude_unset=True)


StorageKind = Literal[
    "checkpoint.stored",
    "checkpoint.store_failed",
    "checkpoint.store_abandoned",
    "checkpoint.fetched",
    "checkpoint.fetch_failed",
]
STORAGE_EVENTS: tuple[str, ...] = get_args(StorageKind)
# Events after which storage holds a step (data["step"]).
HELD_EVENTS = ("checkpoint.stored", "checkpoint.fetched")
# Upload-log entries one poll may carry: the worker keeps its last 50 (worker/checkpoint_store.py LOG_KEEP).
STORAGE_LOG_MAX = 64


class StorageData(_Strict):
    """What an upload-log entry may say besides its kind (worker/checkpoint_store.py `_note`): nothing else."""

    step: _Step | None = None
    best_step: _Step | None = None
    bytes: Annotated[int, Field(ge=0, le=2**53)] | None = None
    seconds: Annotated[float, Field(ge=0, le=1e9)] | None = None
    url: _Long | None = None
    attempt: Annotated[int, Field(ge=0, le=2**31)] | None = None
    retry_in_s: Annotated[float, Field(ge=0, le=1e9)] | None = None
    error: _Long | None = None


class StorageEntry(_Strict):
    seq: Annotated[int, Field(ge=1, le=2**53)]
    time: _Short | None = None
    kind: StorageKind  # one of the storage events: never `started`, `rented.*` or any other kind
    message: _Long = ""
    data: StorageData = StorageData()


class StorageStatus(_Strict):
    """A worker's storage status in its poll reply (worker/checkpoint_store.py CheckpointStore.status)."""

    url: _Long | None = None
    stored_step: _Step | None = None
    stored_at: _Short | None = None
    failures: Annotated[int, Field(ge=0, le=2**31)] = 0
    failing_since: _Short | None = None
    last_error: _Long | None = None
    pending_step: _Step | None = None
    log: Annotated[list[StorageEntry], Field(max_length=STORAGE_LOG_MAX)] = []


class WorkerReply(_Strict):
    """One worker's poll reply (worker/actor.py ArmWorker.poll)."""

    state: Literal["running", "done", "error"]
    info: WorkerInfo
    records: Annotated[list[CheckpointRecord], Field(max_length=RECORDS_PER_POLL)]  # the worker sends no more
    error: Text | None = None
    stopping: bool = False
    ended_by: CommandEnd | None = None  # a command arm that finished: what ended its process
    storage: StorageStatus | None = None  # its upload log: storage events only, bounded


class WorkerLost(_Strict):
    """The node's Ray says the worker is gone (its process died, or it never existed there)."""

    state: Literal["lost"]
    error: Text


class PollResult(_Strict):
    runs: dict[WorkerName, WorkerReply | WorkerLost]


def refused_records(records: list[CheckpointRecord], run_id: int, after: int | None) -> str | None:
    """Why a worker's records cannot be the run's, or None: each needs a step past `after` and up to
    MAX_STEP, and a record that names a run names this one."""
    floor = -1 if after is None else after
    for record in records:
        if not floor < record.step <= MAX_STEP:
            text = str(record.step)
            shown = text if len(text) <= 40 else f"{text[:20]}... ({len(text)} digits)"
            return f"a record with step {shown} (expected an integer after {floor}, at most {MAX_STEP})"
        if record.run_id is not None and record.run_id != run_id:
            return f"a record of step {record.step} claims run {record.run_id!r}, not run {run_id}"
    return None


def first_error(exc: ValidationError) -> str:
    """A refusal in one line: where the first error is (`records.0.train_loss`) and what it is."""
    first = exc.errors()[0]
    return f"{'.'.join(str(p) for p in first['loc']) or 'the value'}: {first['msg']}"
