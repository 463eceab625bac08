"""The grid service: validate a grid body, store it as one queued run per arm, stop runs.

Used by the REST API, the CLI, the importer of published curves and the schedules, so every caller
gets the same validation and the same error paths.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, field_validator, model_validator
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from model.spec import ArmSpec, estimate_params, estimate_peak_bytes, estimate_state_bytes
from orchestrator.db.models import Event, Grid, Metric, Run, utcnow
from orchestrator.db.transitions import transition
from orchestrator.errors import Conflict, InvalidBody
from orchestrator.grids.arms import LINEAGE_KEYS, ArmError, arm_files, resolve
from orchestrator.grids.command_arms import command_errors, is_command_arm, resolve_command_arm
from orchestrator.grids.deciding import DECIDE_WITH_SEEDS, DecideSpec, borrow_errors, dump, with_budget
from orchestrator.grids.gpu_share import gpu_count_errors
from orchestrator.grids.night import plan_grid, planned_spec
from orchestrator.grids.projection import measured_rates
from orchestrator.grids.replicates import MAX_SEEDS, replicate_spec
from orchestrator.grids.tracker_choice import grid_trackers, tracker_errors
from orchestrator.settings import Settings
from orchestrator.vocabulary import TERMINAL_STATES, GridSource, RunDecision, RunState, TrackerName

ARM_LABEL_MAX = 64  # runs.arm is VARCHAR(64)
# An arm's name becomes a path part (a sweep copies each run's checkpoints to runs/<id>-<arm>/).
ARM_LABEL_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
GRID_NAME_MAX = 200  # grids.name is VARCHAR(200)


def check_text(value: str) -> str:
    """Reject what a database text column cannot hold (NUL, lone surrogates), instead of a 500 later."""
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid UTF-8 text") from None
    return value


# Any string validates (an unknown letter gets a 422 listing the known ones); the schema lists the
# known letters so clients and the API fuzzer see what is valid.
ArmLetter = Annotated[str, WithJsonSchema({"type": "string", "enum": sorted(arm_files())})]


class GridCreate(BaseModel):
    """A grid as POST /api/grids and `ablate submit` take it. The minimal body is {"name", "arms"}."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=GRID_NAME_MAX, examples=["tread-vs-muon"])
    # Arm letters from arms/ (A..I), inline specs: {"parent": "G", "name": "G-r16", "flow": {"rank": 16}}, or
    # command arms: {"name": "mine", "code": "/abs/dir", "command": ["python", "train.py"]} (command_arms.py).
    arms: list[ArmLetter | dict[str, Any]] = Field(min_length=1, max_length=64, examples=[["A", "B"]])
    # Deep-merged into every built-in arm, e.g. {"model": {"size": "tiny"}, "schedule": {"steps": 300}};
    # a command arm takes only `detector` from them.
    overrides: dict[str, Any] = Field(default_factory=dict)
    # The arm the stall rule compares against; default: the first arm.
    control: str | None = Field(default=None, examples=["A"])
    # Place the control only on a trusted node (the controller's machine, or one marked `trusted`), so the
    # stall rule may stop the other arms wherever they run (runs/trust.py); else it waits for such a node.
    control_on_trusted: bool = False
    # Training seeds per arm (replicates): each arm runs this many times, seeds 0..N-1 on one held-out
    # split, so the report's effects include training noise (orchestrator/grids/replicates.py).
    seeds: int = Field(default=1, ge=1, le=MAX_SEEDS, examples=[3])
    # Instead of `seeds`: start every arm with decide.min_seeds and add seeds or images only where a
    # comparison is still open, at a stated error rate (orchestrator/grids/deciding.py).
    decide: DecideSpec | None = None
    # Experiment trackers the controller forwards the runs to (docs/trackers.md); unset: ABLATE_TRACKERS.
    trackers: list[TrackerName] | None = Field(default=None, max_length=len(TrackerName), examples=[["tensorboard"]])
    # auto: each built-in arm that does not name its own `gpus` trains on as many GPUs of one node as the
    # night plan gives it (grids/night.py, grids/planner.py), data-parallel; None: one GPU each.
    gpus_per_arm: Literal["auto"] | None = None

    @field_validator("name")
    @classmethod
    def _name_text(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be blank")
        return check_text(v)

    @model_validator(mode="after")
    def _decide_or_seeds(self) -> GridCreate:
        if self.decide is not None and "seeds" in self.model_fields_set:
            raise ValueError(DECIDE_WITH_SEEDS)
        return self

    def first_seeds(self) -> int:
        """Seeds every arm is queued with: `seeds`, or a deciding grid's min_seeds."""
        return self.decide.min_seeds if self.decide is not None else self.seeds


class GridError(InvalidBody):
    """A grid that cannot be created; `errors` carry each problem's path in the grid body."""

    root = "(grid)"


class RunConflict(Conflict):
    """An action that does not apply to the run's current state (e.g. stopping a finished run)."""


def _pydantic_errors(exc: ValidationError, prefix: tuple[Any, ...], note: str = "") -> list[dict[str, Any]]:
    return [
        {"loc": [*prefix, *err["loc"]], "msg": err["msg"] + note, "type": err["type"]}
        for err in exc.errors(include_url=False, include_context=False, include_input=False)
    ]


def _error(loc: tuple[Any, ...], msg: str, kind: str = "value_error") -> dict[str, Any]:
    return {"loc": list(loc), "msg": msg, "type": kind}


def _text_errors(value: Any, loc: tuple[Any, ...]) -> list[dict[str, Any]]:
    """Every string or key under `value` that a database or a JSON response could not carry."""
    errors: list[dict[str, Any]] = []
    if isinstance(value, str):
        try:
            check_text(value)
        except ValueError as exc:
            errors.append(_error(loc, str(exc)))
    elif isinstance(value, dict):
        for key, item in value.items():
            errors += _text_errors(key, (*loc, key)) + _text_errors(item, (*loc, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            errors += _text_errors(item, (*loc, i))
    return errors


def _label(arm: str | dict[str, Any], position: int) -> str:
    if isinstance(arm, str):
        return arm
    name = arm.get("name")
    return name if isinstance(name, str) else f"inline{position + 1}"


def resolve_grid(body: GridCreate) -> list[tuple[str, ArmSpec]]:
    """(label, resolved spec) per arm in order, or GridError listing every problem with its body path.

    An error inside an arm's own fields is reported under ["arms", i, ...]; one that the overrides
    introduce, under ["overrides", ...] (naming the arm it broke).
    """
    # Specs are stored as JSON and echoed by the API, so their text must be clean before anything else.
    errors = _text_errors(body.arms, ("arms",)) + _text_errors(body.overrides, ("overrides",))
    if errors:
        raise GridError(errors)
    for key in sorted(set(body.overrides) & set(LINEAGE_KEYS)):
        errors.append(_error(("overrides", key), f"'{key}' belongs to each arm, not to the grid's overrides"))
    if "command" in body.overrides:
        errors.append(_error(("overrides", "command"), "a command belongs to a command arm of its own, "
                             "not to the grid's overrides"))
    resolved: list[tuple[str, ArmSpec]] = []
    labels: list[str] = []
    for i, arm in enumerate(body.arms):
        label = _label(arm, i)
        labels.append(label)
        if isinstance(arm, dict) and "name" not in arm:
            arm = {**arm, "name": label}
        try:
            check_text(label)
            if not 1 <= len(label) <= ARM_LABEL_MAX:
                raise ValueError(f"arm name must be 1..{ARM_LABEL_MAX} characters")
            if not ARM_LABEL_PATTERN.fullmatch(label):
                raise ValueError(
                    "arm name may hold only letters, digits, '.', '_' and '-', starting with a letter or digit "
                    "(it names files and directories)"
                )
        except ValueError as exc:
            errors.append(_error(("arms", i) if isinstance(arm, str) else ("arms", i, "name"), str(exc)))
            continue
        if is_command_arm(arm):
            spec, problems = resolve_command_arm(arm, i, body.overrides)  # type: ignore[arg-type]
            errors.extend(problems)
            if spec is not None:
                resolved.append((label, spec))
            continue
        try:
            resolve(arm)  # the arm alone, so its own mistakes are reported under its own path
        except ArmError as exc:
            loc = ("arms", i, "parent") if isinstance(arm, dict) and "parent" in arm else ("arms", i)
            errors.append(_error(loc, str(exc)))
            continue
        except ValidationError as exc:
            errors.extend(_pydantic_errors(exc, ("arms", i)))
            continue
        try:
            resolved.append((label, resolve(arm, {k: v for k, v in body.overrides.items() if k not in LINEAGE_KEYS})))
        except ValidationError as exc:
            errors.extend(_pydantic_errors(exc, ("overrides",), note=f" (applied to arm {label})"))
    duplicates = sorted(label for label, n in Counter(labels).items() if n > 1)
    if duplicates:
        errors.append(_error(("arms",), f"arm names must be unique in a grid; repeated: {', '.join(duplicates)}"))
    if body.control is not None and body.control not in labels:
        errors.append(_error(("control",), f"must be one of the grid's arms: {', '.join(labels)}"))
    if errors:
        # The same override error repeats once per arm; report each path and message once.
        unique = {(tuple(map(str, e["loc"])), e["msg"].split(" (applied to arm")[0]): e for e in errors}
        raise GridError(list(unique.values()))
    return resolved


# The largest single-GPU memory an arm can run on (H200, 141 GiB): a model whose training state alone
# exceeds it cannot run anywhere, whatever the batch.
LARGEST_GPU_GIB = 141.0


def memory_errors(body: GridCreate, resolved: list[tuple[str, ArmSpec]], cap_gib: float | None) -> list[dict[str, Any]]:
    """An error per arm whose estimated peak GPU memory exceeds `cap_gib` (None: only its training
    state is checked, against LARGEST_GPU_GIB), naming the estimate and the fields that lower it."""
    errors = []
    for i, (label, spec) in enumerate(resolved):
        if spec.command is not None:  # its model is the researcher's: nothing to estimate
            continue
        loc = ("arms", i) if isinstance(body.arms[i], dict) or not body.overrides else ("overrides",)
        state, state_cap = estimate_state_bytes(spec) / 2**30, cap_gib or LARGEST_GPU_GIB
        if state > state_cap:
            errors.append(
                _error(
                    (*loc, "model"),
                    f"arm {label}: ~{estimate_params(spec) / 1e9:,.1f}B parameters need an estimated {state:,.1f} GiB "
                    f"per GPU for weights, gradients, optimizer and EMA alone, above {state_cap:g} GiB; "
                    "lower model.hidden, model.depth or the model size",
                )
            )
            continue
        peak = estimate_peak_bytes(spec) / 2**30
        if cap_gib and peak > cap_gib:
            micro = spec.schedule.fixed_micro_batch() or 1
            errors.append(
                _error(
                    (*loc, "schedule"),
                    f"arm {label}: estimated peak GPU memory {peak:,.1f} GiB exceeds {cap_gib:g} GiB per GPU at "
                    f"micro-batch {micro}; set schedule.micro_batch lower (or auto, the default) "
                    "or lower schedule.batch_size, data.resolution or the model size",
                )
            )
    return errors


# Weight files a spec may name: plain tensors, loaded with torch.load(weights_only=True).
WEIGHT_SUFFIXES = (".pt", ".pth", ".bin")


def _spec_path(value: str, roots: Sequence[Path], what: str, env: str, suffixes: tuple[str, ...] = ()) -> str | None:
    """Why a worker path from a spec is refused, or None. Lexical (the path is on the worker): absolute,
    no `..`, under one of `roots`, and with a weight file's suffix when `suffixes` are given."""
    path = PurePosixPath(value)
    if not path.is_absolute() or ".." in path.parts:
        return f"must be an absolute path without '..' under {env}"
    if suffixes and path.suffix.lower() not in suffixes:
        return f"must be a {what} ({', '.join(suffixes)}), never a directory or code"
    if not any(path.is_relative_to(PurePosixPath(root)) for root in roots):
        where = ", ".join(map(str, roots)) if roots else "none are configured"
        return f"must lie under a directory the operator allows in {env} ({where})"
    return None


def _spec_url(value: str, prefixes: Sequence[str]) -> str | None:
    """Why a spec's data.url is refused, or None: it must lie under one of the operator's URL prefixes
    (at a path boundary: s3://b/data allows s3://b/data/faces, not s3://b/data-other), without `..`."""
    if ".." in value.split("/"):
        return "must not contain '..'"
    if not any(value == p.rstrip("/") or value.startswith(p.rstrip("/") + "/") for p in prefixes):
        where = ", ".join(prefixes) if prefixes else "none are configured"
        return f"must lie under a URL prefix the operator allows in ABLATE_DATA_URLS ({where})"
    return None


def path_errors(
    body: GridCreate,
    resolved: list[tuple[str, ArmSpec]],
    weights_dirs: Sequence[Path],
    data_dirs: Sequence[Path],
    data_urls: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Spec paths that name files on the workers (REPA teacher, LPIPS weights, dataset) must lie under the
    operator's directories, and a data.url under the operator's URL prefixes: a token holder must not make
    a worker load an arbitrary file, let alone code, or fetch from an arbitrary store."""
    errors = []
    for i, (label, spec) in enumerate(resolved):
        checks = [
            (("repa", "teacher_path"), spec.repa.teacher_path, weights_dirs, "weight file", "ABLATE_WEIGHTS_DIRS"),
            (("eval", "lpips_weights"), spec.eval.lpips_weights, weights_dirs, "weight file", "ABLATE_WEIGHTS_DIRS"),
            (("data", "path"), spec.data.path, data_dirs, "dataset directory", "ABLATE_DATA_DIRS"),
            (("data", "url"), spec.data.url, data_urls, "dataset URL", "ABLATE_DATA_URLS"),
        ]
        for field, value, roots, what, env in checks:
            if value is None:
                continue
            suffixes = WEIGHT_SUFFIXES if what == "weight file" else ()
            problem = (
                _spec_url(value, roots) if what == "dataset URL" else _spec_path(value, roots, what, env, suffixes)
            )
            if problem:
                loc = ("arms", i) if isinstance(body.arms[i], dict) or not body.overrides else ("overrides",)
                errors.append(_error((*loc, *field), f"arm {label}: {value!r} {problem}"))
    return errors


def gpu_memory_cap_gib(session: Session, configured: float) -> float | None:
    """The per-GPU memory arms must fit: ABLATE_MAX_GPU_MEMORY_GIB, else the largest GPU of the probed
    nodes, else None (unknown)."""
    if configured:
        return configured
    from orchestrator.db.models import Node

    mib = [g.get("memory_mib") or 0 for gpus in session.scalars(select(Node.gpus)) for g in gpus or []]
    return max(mib) / 1024 if any(mib) else None


@dataclass(frozen=True)
class PathPolicy:
    """What the operator lets a spec name on the workers (see `path_errors` and `command_errors`)."""

    weights_dirs: Sequence[Path] = ()
    data_dirs: Sequence[Path] = ()
    data_urls: Sequence[str] = ()  # URL prefixes for data.url
    allow_commands: bool = False  # command arms at all (ABLATE_ALLOW_COMMANDS)
    command_dirs: Sequence[Path] = ()  # where their code may lie (ABLATE_COMMAND_DIRS)

    @classmethod
    def from_settings(cls, settings: Settings) -> PathPolicy:
        return cls(settings.weights_dirs, settings.data_dirs, settings.data_urls, settings.allow_commands,
                   settings.command_dirs)

    def errors(self, body: GridCreate, resolved: list[tuple[str, ArmSpec]]) -> list[dict[str, Any]]:
        """Every spec path and command this policy refuses."""
        found = path_errors(body, resolved, self.weights_dirs, self.data_dirs, self.data_urls)
        return found + command_errors(resolved, self.allow_commands, self.command_dirs)


def create_grid(
    session: Session,
    body: GridCreate,
    source: GridSource = GridSource.submitted,
    max_gpu_memory_gib: float | None = None,
    paths: PathPolicy | None = None,
    default_trackers: Sequence[TrackerName] = (),
    node_gpus: int | None = None,
    nodes: Mapping[str, int] | None = None,
) -> Grid:
    """Store the grid and one queued run per arm and training seed with its fully resolved spec; flushes,
    no commit. Seed-major order: every arm's seed 0 is queued before any seed 1, so a night cut short
    still holds complete comparisons.

    An arm that cannot fit a GPU is a GridError: see `memory_errors` (cap `max_gpu_memory_gib`). With
    `paths` (every grid a client submits), spec paths outside the operator's directories are too; a
    command arm is refused unless `paths` allows commands (without it, none is allowed). A grid that names
    no trackers forwards to `default_trackers` (ABLATE_TRACKERS); a tracker whose client is not installed
    is a GridError naming its extra. `node_gpus`: the largest node's GPUs (grids/gpu_share.py
    largest_node_gpus): an arm asking for more is a GridError; None (unknown) checks nothing and gives each
    arm its own count. `nodes`: each node's GPUs (gpu_share.node_gpus; default one node of `node_gpus`):
    the grid's night plan (grids/night.py) is drawn over them and stored, and with `gpus_per_arm: auto`
    each run takes the GPU count the plan gives it.
    """
    resolved = resolve_grid(body)
    if nodes is None and node_gpus:
        nodes = {"node": node_gpus}
    node_gpus = node_gpus or max((nodes or {}).values(), default=0) or None
    auto = body.gpus_per_arm == "auto"
    seeds = body.first_seeds()
    plan = plan_grid(resolved, seeds, nodes, measured_rates(session, None), auto) if nodes else None
    errors = memory_errors(body, resolved, max_gpu_memory_gib) + tracker_errors(body.trackers, default_trackers)
    errors += gpu_count_errors(body.arms, body.overrides, resolved, node_gpus) + borrow_errors(session, body.decide)
    if paths is not None:
        errors += paths.errors(body, resolved)
    else:
        errors += command_errors(resolved, allowed=False, command_dirs=())
    if errors:
        raise GridError(errors)
    control = body.control if body.control is not None else resolved[0][0]
    grid = Grid(
        name=body.name,
        control_arm=control,
        overrides=body.overrides,
        source=source,
        seeds=seeds,
        decide=dump(with_budget(body.decide, resolved, control)) if body.decide is not None else None,
        control_on_trusted=body.control_on_trusted,
        trackers=grid_trackers(body.trackers, default_trackers) if source != GridSource.imported else [],
    )
    grid.plan = plan.model_dump(mode="json") if plan is not None else None
    grid.runs = [
        Run(position=seed * len(resolved) + i, arm=label, seed=seed,
            spec=(replicate_spec(planned_spec(spec, plan, label, seed, seeds), seed) if seeds > 1
                  else planned_spec(spec, plan, label, seed, 1)).model_dump(mode="json"),
            state=RunState.queued)
        for seed in range(seeds)
        for i, (label, spec) in enumerate(resolved)
    ]  # fmt: skip
    session.add(grid)
    session.flush()
    words = f" x {seeds} seeds" if seeds > 1 else ""
    words += f", deciding up to {body.decide.max_seeds} seeds" if body.decide is not None else ""
    session.add(Event(grid_id=grid.id, kind="grid.created", message=f"{len(resolved)} arms{words} ({source})"))
    return grid


def latest_metrics(session: Session, run_ids: list[int]) -> dict[int, Metric]:
    """The newest checkpoint's metrics per run id (runs without metrics are absent)."""
    if not run_ids:
        return {}
    newest = (
        select(Metric.run_id, func.max(Metric.step).label("step"))
        .where(Metric.run_id.in_(run_ids))
        .group_by(Metric.run_id)
        .subquery()
    )
    rows = session.scalars(
        select(Metric).join(newest, (Metric.run_id == newest.c.run_id) & (Metric.step == newest.c.step))
    )
    return {m.run_id: m for m in rows}


def stop_run(session: Session, run: Run, now: datetime | None = None) -> Run:
    """Stop a run on the user's request; flushes, no commit.

    queued: stopped at once (decision "user"). starting/running: `stop_requested` is set and the
    launcher stops the worker gracefully. Already finished: RunConflict.
    """
    if run.state == RunState.queued:
        # Compare-and-set: the launcher may be launching it right now. Whoever moves it out of
        # `queued` first wins; losing here means it is starting, so the stop is requested below.
        reason = "stopped by the user before it started"
        stopped = dict(state=RunState.stopped, decision=RunDecision.USER, decision_reason=reason)
        if transition(session, run, RunState.queued, **stopped, finished_at=now or utcnow()):
            session.add(Event(run_id=run.id, grid_id=run.grid_id, kind="stopped", message=reason))
            session.flush()
            return run
    if run.state in TERMINAL_STATES:
        raise RunConflict(f"run {run.id} is already {run.state}; nothing to stop")
    if not run.stop_requested:
        run.stop_requested = True
        session.add(Event(run_id=run.id, grid_id=run.grid_id, kind="stop_requested", message="requested by the user"))
    session.flush()
    return run
