"""Service settings: one pydantic-settings object, every variable prefixed ABLATE_."""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings import SettingsError as EnvParseError

from orchestrator.vocabulary import TrackerName

DEFAULT_DIR = Path(".ablate")
# A shorter token is refused: 16 random characters are out of reach of online guessing.
MIN_TOKEN_LENGTH = 16
PREFIX = "ABLATE_"
# Settings renamed, old name -> new ("storage" also meant checkpoint storage, "scheduler" also the cron table).
# The old ABLATE_ variable (a logged warning) and keyword (a FutureWarning) still work, each message naming
# the new one; where both are set, the new one wins.
RENAMED = {"storage_dir": "home_dir", "scheduler_interval_s": "launcher_interval_s"}

log = logging.getLogger(__name__)


class SettingsError(RuntimeError):
    """Invalid environment: the message names each ABLATE_ variable and what is wrong with it."""


def _renamed(old: str, new: str, ignored: bool) -> str:
    if ignored:
        return f"{old} is deprecated and ignored: {new} is set; remove {old}"
    return f"{old} is deprecated: read as {new}; use {new} instead"


class _RenamedVariables(PydanticBaseSettingsSource):
    """The ABLATE_ variables of RENAMED under their old names, read as the new ones (below the new ones)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # __call__ reads the whole environment at once

    def __call__(self) -> dict[str, Any]:
        env = {k.upper(): v for k, v in os.environ.items() if v}  # env_ignore_empty, case-insensitive
        out = {}
        for old, new in RENAMED.items():
            old_var, new_var = PREFIX + old.upper(), PREFIX + new.upper()
            if old_var in env:
                log.warning(_renamed(old_var, new_var, ignored=new_var in env))
                out[new] = env[old_var]
        return out


class Settings(BaseSettings):
    # An empty variable (ABLATE_API_TOKEN=) counts as unset, never as an empty token or path.
    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore", env_ignore_empty=True)

    def __init__(self, **values: Any) -> None:
        for old, new in RENAMED.items():
            if old in values:
                message = _renamed(f"Settings({old}=)", f"Settings({new}=)", ignored=new in values)
                warnings.warn(message, FutureWarning, stacklevel=2)
                values.setdefault(new, values.pop(old))
        super().__init__(**values)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Earlier sources win: a keyword over ABLATE_HOME_DIR over the old ABLATE_STORAGE_DIR.
        return init_settings, env_settings, _RenamedVariables(settings_cls), dotenv_settings, file_secret_settings

    # SQLite under ./.ablate/ is the embedded default; production points this at Postgres
    # (postgresql+psycopg://user@host/db).
    database_url: str = f"sqlite:///{DEFAULT_DIR / 'ablate.db'}"
    # Bearer token for every write (and the reads that expose infrastructure). Unset: `ablate serve`
    # generates one into home_dir/api_token. At least 16 characters, checked where a token is used
    # (`ablate serve`, `ablate submit`: server.read_token), so commands that need none run with any.
    api_token: str | None = None
    # The controller's own machine is a node too (its agent runs as a child process). false: it trains
    # nothing, and every arm goes to joined nodes (a controller that only drives rented machines).
    local_node: bool = True
    # A Ray on this machine for the local node's agent to join ("auto", an address), e.g. one shared with
    # other tools; unset: the agent runs a Ray of its own. Nodes never join it: each runs its own Ray.
    ray_address: str | None = None
    # The token (Ray's token auth) of ray_address. Unset: home_dir/ray_token when that file exists.
    ray_token_file: Path | None = None
    # Seconds a node may stay unreachable (its agent link down) before its arms count as lost and are
    # re-queued from their checkpoints; a node whose agent breaks the protocol loses them at once.
    node_lost_s: Annotated[float, Field(gt=0)] = 60.0
    # ablate's home directory (was storage_dir): on the controller its token, reports, logs, sweeps' copied-back
    # results and, by default, checkpoint storage; on every node (the same path) the runs' directories and
    # caches. Not to be confused with checkpoint storage (checkpoint_url), which outlives a node.
    home_dir: Path = DEFAULT_DIR
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    # The controller the CLI and `ablate mcp` talk to (ABLATE_URL, e.g. https://ablate.lab:8000); unset:
    # http://host:port. Every command reads and changes a controller's state through its REST API only.
    url: str | None = None
    # Logical GPUs to declare to a local Ray on a machine without GPUs (tests, the demo);
    # 0 = let Ray detect the real ones.
    logical_gpus: Annotated[int, Field(ge=0)] = 0
    # How often the run launcher looks for queued runs and free GPUs, in seconds (was scheduler_interval_s).
    launcher_interval_s: Annotated[float, Field(gt=0)] = 0.5
    # What growing a running arm onto freed GPUs costs beyond the evaluation of the checkpoint its stop
    # writes, in seconds: the restart, compiled from the stored compile cache (runs/grow.py). An arm grows
    # only when its grid's night ends earlier by more than that.
    grow_resume_s: Annotated[float, Field(ge=0)] = 17.0
    # How many times a run whose worker died is re-queued before it is marked failed.
    max_retries: Annotated[int, Field(ge=0)] = 2
    # Seconds a launched worker may wait for Ray to place it (no first reply) before it is killed and
    # its run re-queued as a retry (e.g. its GPU is held by something outside ablate).
    start_timeout_s: Annotated[float, Field(gt=0)] = 600.0
    # Ray namespace of the workers (named, detached actors): a restarted controller finds them there.
    ray_namespace: str = "ablate"
    # torch intra-op threads per worker; 0 = leave it to Ray (OMP_NUM_THREADS) and torch.
    worker_threads: Annotated[int, Field(ge=0)] = 0
    # Local AlexNet weights for the lpips backbone (torchvision's alexnet state dict), for offline use.
    lpips_weights: Path | None = None
    # Durable checkpoint storage, an fsspec URL: file:///shared/path, s3://bucket/prefix or
    # sftp://user@host[:port]/abs/path. Unset: file://<home_dir>/checkpoints on the controller's disk,
    # which survives a worker on this host but not a lost rented node: point nodes at a shared store.
    checkpoint_url: str | None = None
    # fsspec storage options for it, as JSON: {"endpoint_url": ...} for an S3-compatible store,
    # {"key_filename": ..., "known_hosts": ...} for sftp. Credentials come from the usual AWS variables
    # or profile and SSH keys on each machine, never from here (workers receive these options).
    checkpoint_options: dict[str, Any] = Field(default_factory=dict)
    # Where compiled arms store their compile caches for a fresh node to load (worker/compile_cache.py),
    # an fsspec URL like checkpoint_url, read with checkpoint_options. Unset: each node keeps its own cache
    # only. Loading a cache runs the code in it: see docs/security.md before pointing rented nodes at one.
    compile_cache_url: str | None = None
    # Periodic checkpoints kept in storage per run, besides best.pt (each is model + EMA + optimizer state).
    checkpoint_keep_last: Annotated[int, Field(ge=1)] = 2
    # A run whose newest checkpoint has not reached storage for this many minutes is flagged on the dashboard.
    checkpoint_alarm_minutes: Annotated[float, Field(gt=0)] = 15.0
    # How long a finishing worker waits for its last upload (and a resuming one for a failing store).
    checkpoint_flush_timeout_s: Annotated[float, Field(gt=0)] = 900.0
    # The most bytes a sweep's copy-back takes of one run (from storage or its node): a node writes what is
    # there, and the controller's disk is not its to fill. Unset: sized to each run's kept checkpoints
    # (keep_last + best.pt + one being replaced, at the arm's model size, a tenth spare, 1 GiB for samples
    # and records: about 18 GB for a seed-size arm; 16 GiB for a command arm): runs/storage.py copy_back_bytes.
    copy_back_max_bytes: int | None = Field(default=None, gt=0)
    # Request bodies above this many bytes answer 413 before they are parsed (a grid spec is a few KB).
    max_body_bytes: Annotated[int, Field(ge=1024)] = 1 << 20
    # True: grid, run and dashboard reads need the token too (nodes and schedules always do).
    private_reads: bool = False
    # Directories on the workers under which spec paths to weight files (repa.teacher_path,
    # eval.lpips_weights) and datasets (data.path) may lie; a spec naming anything else is refused.
    # Empty: specs may name no such path (stand-ins, built-in datasets and ABLATE_LPIPS_WEIGHTS only).
    weights_dirs: list[Path] = []
    # Directories on the controller from which POST /api/nodes may name SSH keys and known-hosts files.
    ssh_key_dirs: list[Path] = [Path("~/.ssh")]
    data_dirs: list[Path] = []
    # URL prefixes under which a spec's data.url may lie (s3://bucket/datasets, sftp://host/srv/data); empty:
    # specs may name none. A worker fetches data.url with ABLATE_DATA_OPTIONS (unset: the checkpoint options)
    # into ABLATE_DATA_CACHE_DIR on its node (unset: <home_dir>/data-cache, the disk of its runs).
    data_urls: list[str] = []
    # True: a grid may hold command arms (a researcher's own training command, run on the nodes as the
    # arm's process). Off by default: a spec that names code is code execution on the nodes.
    allow_commands: bool = False
    # Directories on the nodes under which a command arm's `code` may lie; empty: none may.
    command_dirs: list[Path] = []
    # The most bytes of files a command arm's `code` may hold: it is packed and copied to each joined
    # node that runs the arm (orchestrator/runs/command_code.py). Code, not data or checkpoints.
    command_max_bytes: int = Field(default=64 << 20, gt=0)
    data_options: dict[str, Any] | None = None
    data_cache_dir: Path | None = None
    # Per-GPU memory an arm's estimated peak may use, in GiB. 0: the largest GPU among the probed nodes;
    # with none probed, only the training state is checked, against the largest GPU there is (141 GiB).
    max_gpu_memory_gib: Annotated[float, Field(ge=0)] = 0.0
    # True: pretrained weights (LPIPS's AlexNet, REPA's DINOv2) are never downloaded; missing ones are an
    # error naming the fix. Read where the weights load (model/hub.py); declared here so a bad value
    # stops start-up.
    offline: bool = False
    # -- experiment trackers (orchestrator/trackers/): the controller forwards what it ingests --
    # Trackers every grid forwards to unless its body names its own ("trackers": [...]): wandb, tensorboard,
    # mlflow, as a JSON list or comma-separated. Each needs its extra (pip install 'ablate-dit[wandb]'); their own
    # settings come from their usual variables (WANDB_PROJECT, WANDB_ENTITY, WANDB_MODE, MLFLOW_TRACKING_URI,
    # MLFLOW_EXPERIMENT_NAME). Nodes never see any of them.
    trackers: Annotated[list[TrackerName], NoDecode] = []
    # TensorBoard's log directory (one folder per grid, one run per arm); unset: home_dir/tensorboard.
    tensorboard_dir: Path | None = None
    # Tries per forwarding step before a tracker counts as unreachable for now (recorded on the run); its
    # points stay due and go out when it answers again, after a pause growing up to tracker_backoff_max_s.
    tracker_retries: Annotated[int, Field(ge=1, le=10)] = 3
    tracker_backoff_max_s: Annotated[float, Field(gt=0)] = 60.0
    # -- rented nodes (orchestrator/fleet/providers/) --
    # This controller's name in the label of every instance it rents (`ablate.<id>.s<sweep>`): the reaper
    # destroys only instances with its own id, so two controllers can share one provider account. Unset: an
    # id generated once per installation and stored in its database (orchestrator/fleet/providers/identity.py);
    # a fixed default would make a second installation reap the first one's instances.
    controller_id: Annotated[str | None, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,31}$")] = None
    # Provider API keys: the variable, or a file readable by the controller's user only (mode 0600).
    # SecretStr: never shown by repr, a log line or a response. Never stored in the database.
    vast_api_key: SecretStr | None = None
    vast_api_key_file: Path | None = None
    runpod_api_key: SecretStr | None = None
    runpod_api_key_file: Path | None = None
    # Base URLs of the providers' APIs; unset: the SDKs' defaults. The tests point them at a simulator.
    vast_url: str | None = None  # vastai's server_url (default https://console.vast.ai)
    runpod_api_url: str | None = None  # runpod's RUNPOD_API_BASE_URL (default https://api.runpod.io)
    # The controller's SSH key for the nodes it rents (its .pub is handed to each instance, the only key
    # let in). Unset: home_dir/ssh/rent_ed25519, made on first use.
    rent_ssh_key: Path | None = None
    # The image rented instances run: CUDA, sshd and Python. Best: the worker image (docker/worker.Dockerfile)
    # pushed to a registry the provider pulls from, whose environment bootstrap finds with this version in it
    # and so installs nothing at fire; any other image gets the install, as registered nodes do.
    rent_image: str = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
    # The dead-man's switch on every rented node (orchestrator/fleet/deadman.py): at the sweep's budget end
    # plus the grace (or `without_budget_s` after the fire) the node destroys itself through the provider's
    # API with its own instance-scoped key, then runs this command through `sh -c`. Tests touch a file.
    rent_deadman_command: str = "sudo -n poweroff || poweroff || shutdown -h now"
    rent_deadman_grace_s: float = Field(default=3600.0, ge=0)  # the runner's stop grace + copy-back + teardown
    rent_deadman_without_budget_s: float = Field(default=24 * 3600.0, gt=0)
    rent_deadman_python: str = "python3"  # the node's Python, which starts the switch before bootstrap
    rent_deadman_enabled: bool = True  # false only for tests whose "rented node" is this machine

    @field_validator("database_url")
    @classmethod
    def _known_driver(cls, v: str) -> str:
        if not v.startswith(("sqlite:///", "postgresql")):
            raise ValueError("must be a sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DB URL")
        # psycopg 3 is the driver installed; plain postgresql:// would make SQLAlchemy look for psycopg2.
        if v.startswith("postgresql://"):
            return "postgresql+psycopg://" + v.removeprefix("postgresql://")
        return v

    @field_validator("trackers", mode="before")
    @classmethod
    def _tracker_list(cls, v: Any) -> Any:
        """ABLATE_TRACKERS=wandb,tensorboard or a JSON list."""
        if isinstance(v, str):
            text = v.strip()
            return json.loads(text) if text.startswith("[") else [p.strip() for p in text.split(",") if p.strip()]
        return v

    @field_validator("checkpoint_url", "compile_cache_url")
    @classmethod
    def _known_store(cls, v: str | None) -> str | None:
        if v is None:
            return v
        scheme, sep, rest = v.partition("://")
        ok = sep and (
            (scheme == "file" and rest.startswith("/"))
            or (scheme == "s3" and rest.strip("/"))
            or (scheme == "sftp" and "/" in rest and rest.split("/", 1)[0])
        )
        if not ok:
            raise ValueError(
                "must be file:///ABSOLUTE/PATH, s3://BUCKET[/PREFIX] or sftp://[USER@]HOST[:PORT]/ABSOLUTE/PATH"
            )
        return v.rstrip("/")

    @property
    def checkpoint_root(self) -> str:
        """Checkpoint storage: where runs' checkpoints are stored (each run under its own prefix)."""
        return self.checkpoint_url or f"file://{(self.home_dir.resolve() / 'checkpoints').as_posix()}"

    @property
    def tensorboard_root(self) -> Path:
        return self.tensorboard_dir or self.home_dir / "tensorboard"

    @property
    def token_file(self) -> Path:
        return self.home_dir / "api_token"

    @property
    def cluster_token_file(self) -> Path | None:
        """The Ray cluster token to present, if any (see ray_token_file)."""
        if self.ray_token_file is not None:
            return self.ray_token_file
        default = self.home_dir / "ray_token"
        return default if default.is_file() else None


def load_settings() -> Settings:
    """Settings from the environment, or SettingsError naming the offending variables."""
    try:
        return Settings()
    except ValidationError as exc:
        problems = [f"ABLATE_{str(err['loc'][0]).upper()}: {err['msg']}" for err in exc.errors()]
        raise SettingsError("invalid settings: " + "; ".join(problems)) from None
    except EnvParseError as exc:  # a JSON-valued variable (ABLATE_CHECKPOINT_OPTIONS) that is not JSON
        field = str(exc).split('"')[1] if '"' in str(exc) else "?"
        raise SettingsError(f"invalid settings: ABLATE_{field.upper()}: must be a JSON object") from None

