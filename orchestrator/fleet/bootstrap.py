"""How a node joins and leaves the Ray cluster: install, join, drain, tear down, as command templates
the operator can change (ABLATE_NODE_* settings) run over the node's SSH shell."""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from orchestrator.db.models import Event, Node
from orchestrator.db.session import session_scope
from orchestrator.fleet.errors import NodeError
from orchestrator.fleet.inventory import get_node, set_state
from orchestrator.fleet.probe import probe
from orchestrator.fleet.shell import CommandFailed, NodeShell
from orchestrator.vocabulary import NodeState


class BootstrapConfig(BaseSettings):
    """How a node becomes a Ray worker. Environment: ABLATE_NODE_<FIELD> (lists as JSON arrays).

    Each command is a template with {python}, {remote_dir}, {venv}, {package}, {ray_address},
    {num_gpus}, {token_path}, {env}, {join_args}, {find_links}; commands run in order and the first
    failure stops the sequence.
    """

    model_config = SettingsConfigDict(env_prefix="ABLATE_NODE_", extra="ignore", env_ignore_empty=True)

    # The controller's Ray head as workers reach it (host:6379). Required for bootstrap.
    ray_address: str | None = None
    # The cluster token on the controller (`ablate ray-head` writes storage_dir/ray_token). Copied to
    # the node as {remote_dir}/ray_token, mode 0600 in a 0700 directory; Ray reads it from the file
    # RAY_AUTH_TOKEN_PATH names, so the token is never on a command line.
    token_file: Path | None = None
    # A wheel or sdist of this project built on the controller (`pip wheel --no-deps .`), copied over SFTP.
    package: Path | None = None
    # A local wheelhouse on the controller (`pip wheel -w wheelhouse '.[gpu]'`), copied over SFTP: the
    # install then never needs a package index (--no-index --find-links). None: install from the index.
    wheelhouse: Path | None = None
    # Working directory on the node; relative paths are under the login directory (SFTP and shell agree).
    remote_dir: str = "ablate"
    # A Python environment already on the node (a worker image's); None: {remote_dir}/venv, made by install.
    venv: str | None = None
    python: str = "python3"
    # Ray needs the same Python major.minor on every node of a cluster: checked before installing.
    match_python: bool = True
    install: list[str] = [
        "{python} -m venv {venv}",
        "{venv}/bin/pip install {find_links} --upgrade pip",
        "{venv}/bin/pip install {find_links} {package}",
    ]
    # The node's Ray runs in its own process session (recorded in {remote_dir}/ray/session) and temp dir.
    join: list[str] = [
        "{env} RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={token_path} "
        "{venv}/bin/python -m orchestrator.fleet.ray_cluster "
        'start-session {remote_dir}/ray -- {venv}/bin/ray start --address={ray_address} --num-gpus={num_gpus} '
        '--temp-dir="$HOME"/{remote_dir}/ray-tmp --disable-usage-stats {join_args}'
    ]
    # Extra `ray start` arguments (e.g. --num-cpus=4) and environment (NAME: value) of the join command.
    join_args: str = ""
    env: dict[str, str] = {}
    # Leaving the cluster stops exactly the node's Ray session: never `ray stop`, which ends every
    # Ray process of the machine.
    leave: list[str] = ["{env} {venv}/bin/python -m orchestrator.fleet.ray_cluster stop-session {remote_dir}/ray"]
    # After leave, on teardown. Checkpoints are copied back before this runs.
    cleanup: list[str] = ["rm -rf {remote_dir}"]
    # Seconds per command; pip installing torch on a fresh node takes minutes.
    command_timeout_s: float = Field(default=1800.0, gt=0)

    @field_validator("remote_dir")
    @classmethod
    def _safe_remote_dir(cls, v: str) -> str:
        # cleanup runs `rm -rf` on it: only a dedicated directory below the login directory, compared
        # after normalising (so `ablate/..`, `./`, `~/.` are the home directory they name).
        path = PurePosixPath(v.strip())
        parts = [p for p in path.parts if p != "."]
        if path.is_absolute() or ".." in parts or not parts or parts[0].startswith(("~", "$")):
            raise ValueError(
                f"{v!r} must be a dedicated directory relative to the login directory, such as 'ablate', "
                "without '..', '~', '$' or a leading '/' (teardown deletes it)"
            )
        return str(PurePosixPath(*parts))

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
        if bad:
            raise ValueError(f"not environment variable names: {', '.join(map(repr, bad))}")
        return v

    def variables(self, num_gpus: int, package: str = "") -> dict[str, str]:
        venv = self.venv or f"{self.remote_dir}/venv"
        wheels = f"{self.remote_dir}/wheelhouse"
        return {
            "python": shlex.quote(self.python),
            "remote_dir": shlex.quote(self.remote_dir),
            "venv": shlex.quote(venv),
            "package": shlex.quote(package) if package else "",
            "ray_address": shlex.quote(self.ray_address or ""),
            "num_gpus": str(num_gpus),
            "token_path": '"$HOME"/' + shlex.quote(f"{self.remote_dir}/ray_token"),
            "env": " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items()),
            "join_args": self.join_args,
            "find_links": f"--no-index --find-links {shlex.quote(wheels)}" if self.wheelhouse else "",
        }


def run_steps(shell: NodeShell, templates: Sequence[str], variables: dict[str, str], timeout_s: float) -> None:
    """Run each command template in order; the first failure raises CommandFailed and stops the rest."""
    for template in templates:
        try:
            command = template.format(**variables)
        except (KeyError, IndexError) as exc:
            raise NodeError(f"command template {template!r} uses unknown placeholder {exc}") from None
        shell.run(command, timeout_s)


def bootstrap(shell: NodeShell, config: BootstrapConfig, num_gpus: int) -> None:
    """Install the worker environment on the node and join the controller's Ray cluster; what fails is
    tagged with its step (check, upload, install, join) for the node's state."""
    with bootstrap_step("check"):
        _check(shell, config)
    with bootstrap_step("upload"):
        remote_package = _upload(shell, config)
    variables = config.variables(num_gpus, remote_package)
    with bootstrap_step("install"):
        run_steps(shell, config.install, variables, config.command_timeout_s)
    with bootstrap_step("join"):
        run_steps(shell, config.join, variables, config.command_timeout_s)


def _check(shell: NodeShell, config: BootstrapConfig) -> None:
    """What must hold before anything is copied: the settings the templates need, the Python version."""
    joining = "\n".join(config.join)
    if not config.ray_address and "{ray_address}" in joining:
        raise NodeError("ABLATE_NODE_RAY_ADDRESS is not set: the Ray head address (host:6379) nodes must join")
    if "{token_path}" in joining and (config.token_file is None or not config.token_file.is_file()):
        raise NodeError(
            f"ABLATE_NODE_TOKEN_FILE {config.token_file or '(unset)'} is not a file: the Ray cluster token "
            "(`ablate ray-head` writes it to the storage dir as ray_token)"
        )
    needs_package = any("{package}" in t for t in config.install)
    if needs_package and config.package is None:
        raise NodeError("ABLATE_NODE_PACKAGE is not set: build one with `pip wheel --no-deps -w dist .`")
    if config.match_python:
        query = f"{shlex.quote(config.python)} -c 'import sys; print(*sys.version_info[:2])'"
        version = shell.run(query, 60).stdout.split()
        local = [str(v) for v in sys.version_info[:2]]
        if version != local:
            raise NodeError(
                f"node {shell.name!r}: {config.python} is Python {'.'.join(version)} but the controller runs "
                f"{'.'.join(local)}; Ray needs the same Python minor version on every node: set "
                f"ABLATE_NODE_PYTHON to a python{'.'.join(local)} on the node (or ABLATE_NODE_MATCH_PYTHON=false)"
            )


def _upload(shell: NodeShell, config: BootstrapConfig) -> str:
    """The token, the package and the wheelhouse onto the node; returns the package's remote path."""
    joining = "\n".join(config.join)
    # 0700 before anything goes in: the token must never be readable by other users of the node.
    shell.run(f"mkdir -p {shlex.quote(config.remote_dir)} && chmod 700 {shlex.quote(config.remote_dir)}", 60)
    if config.token_file is not None and "{token_path}" in joining:
        shell.put(config.token_file, f"{config.remote_dir}/ray_token", mode=0o600)
    remote_package = ""
    if config.package is not None:
        if not config.package.is_file():
            raise NodeError(f"ABLATE_NODE_PACKAGE {config.package} does not exist on the controller")
        remote_package = f"{config.remote_dir}/{config.package.name}"
        shell.put(config.package, remote_package)
    if config.wheelhouse is not None:
        wheels = sorted(config.wheelhouse.glob("*.whl")) if config.wheelhouse.is_dir() else []
        if not wheels:
            raise NodeError(f"ABLATE_NODE_WHEELHOUSE {config.wheelhouse} holds no wheels (`pip wheel -w DIR ...`)")
        shell.run(f"mkdir -p {shlex.quote(config.remote_dir)}/wheelhouse", 60)
        for wheel in wheels:
            shell.put(wheel, f"{config.remote_dir}/wheelhouse/{wheel.name}")
    return remote_package


def drain(shell: NodeShell, config: BootstrapConfig) -> None:
    """Leave the Ray cluster; the node keeps its environment (running arms are re-queued elsewhere)."""
    run_steps(shell, config.leave, config.variables(0), config.command_timeout_s)


def teardown(shell: NodeShell, config: BootstrapConfig) -> None:
    """Leave the cluster and delete the working directory (copy checkpoints back first)."""
    drain(shell, config)
    run_steps(shell, config.cleanup, config.variables(0), config.command_timeout_s)


def _set_state(database_url: str, name: str, state: NodeState, detail: str | None = None) -> None:
    with session_scope(database_url) as session:
        set_state(get_node(session, name), state, detail)


@contextmanager
def bootstrap_step(name: str) -> Iterator[None]:
    """Tag what fails inside with the bootstrap step it failed in (the innermost step wins)."""
    try:
        yield
    except Exception as exc:
        if not hasattr(exc, "bootstrap_step"):
            exc.bootstrap_step = name  # type: ignore[attr-defined]
        raise


def failure_detail(exc: BaseException) -> str:
    """Where a bootstrap failed, short enough for a table cell: `join: exit 126`, `install: timed out`,
    `upload: OSError` (the command and its output are in the node's command events)."""
    step = getattr(exc, "bootstrap_step", "connect")
    if isinstance(exc, CommandFailed):
        return f"{step}: " + ("timed out" if exc.result.timed_out else f"exit {exc.result.exit_code}")
    return f"{step}: {type(exc).__name__}"


def _with_node(database_url: str, name: str) -> Node:
    with session_scope(database_url) as session:
        node = get_node(session, name)
        session.expunge(node)
    return node


def bootstrap_node(database_url: str, name: str, config: BootstrapConfig | None = None) -> dict[str, Any]:
    """Probe, then bootstrap a registered node (state "joined"); returns the probe JSON."""
    config = config or BootstrapConfig()
    node = _with_node(database_url, name)
    try:
        with NodeShell.open(node, database_url) as shell:
            found = probe(shell)
            if not found["gpus"]:
                raise NodeError(f"node {name!r}: nvidia-smi lists no GPUs")
            bootstrap(shell, config, num_gpus=len(found["gpus"]))
    except Exception as exc:
        # Marked on the node (the dashboard and `ablate nodes list` say so), then raised as before.
        detail = failure_detail(exc)
        with session_scope(database_url) as session:
            row = get_node(session, name)
            row.state, row.state_detail = NodeState.bootstrap_failed, detail
            session.add(Event(node_id=row.id, kind="node.bootstrap_failed", message=f"{detail}: {exc}"[:2000]))
        raise
    with session_scope(database_url) as session:
        row = get_node(session, name)
        row.gpus, row.last_probe = found["gpus"], found
        row.state, row.state_detail = NodeState.joined, None
    return found


def drain_node(database_url: str, name: str, config: BootstrapConfig | None = None) -> None:
    config = config or BootstrapConfig()
    with NodeShell.open(_with_node(database_url, name), database_url) as shell:
        drain(shell, config)
    _set_state(database_url, name, NodeState.drained)


def teardown_node(database_url: str, name: str, config: BootstrapConfig | None = None) -> None:
    config = config or BootstrapConfig()
    with NodeShell.open(_with_node(database_url, name), database_url) as shell:
        teardown(shell, config)
    _set_state(database_url, name, NodeState.registered)
