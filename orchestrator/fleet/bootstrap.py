"""How a node becomes one the launcher trains on: install, start its own Ray, drain, tear down, as
command templates the operator can change (ABLATE_NODE_* settings) run over the node's SSH shell.

A node never joins a cluster with the controller or other nodes: it runs its own Ray head on its
loopback, with a token generated on the node that never leaves it (worker/node_ray.py), and the
controller drives it through its agent (worker/agent.py) over the same SSH connection. Bootstrap writes
the agent's launcher, `{remote_dir}/agent`, with the node's Python environment and `env` in it.

A node started from the worker image (docker/worker.Dockerfile) names its environment in /etc/ablate-node;
when that environment already holds this controller's code (orchestrator/version.py `same_code`: the same
version, or the same commit), the install is skipped."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from orchestrator.db.models import Event, Node
from orchestrator.db.session import session_scope
from orchestrator.fleet.errors import NodeError, error_reason
from orchestrator.fleet.inventory import get_node, set_state
from orchestrator.fleet.probe import probe
from orchestrator.fleet.shell import CommandFailed, NodeShell
from orchestrator.version import same_code, version_text
from orchestrator.vocabulary import NodeState

NODE_MARKER = "/etc/ablate-node"  # written by the worker image: the path of its Python environment
_ENV_PATH = re.compile(r"/[A-Za-z0-9._/-]+")  # what a marker may name (the node is not trusted)
_VERSION = "from orchestrator.version import version_text; print(version_text())"


class BootstrapConfig(BaseSettings):
    """How a node becomes one the launcher trains on. Environment: ABLATE_NODE_<FIELD> (lists as JSON
    arrays).

    Each command is a template with {python}, {remote_dir}, {venv}, {package}, {num_gpus}, {env},
    {find_links}; commands run in order and the first failure stops the sequence.
    """

    model_config = SettingsConfigDict(env_prefix="ABLATE_NODE_", extra="ignore", env_ignore_empty=True)
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
    install: list[str] = [
        "{python} -m venv {venv}",
        "{venv}/bin/pip install {find_links} --upgrade pip",
        "{venv}/bin/pip install {find_links} {package}",
    ]
    # The node's own Ray head (loopback, node-local token, its own process session and temp dir under
    # {remote_dir}/ray), started now so the first arm does not wait for it; the agent restarts it if it
    # is down (a rebooted node).
    start: list[str] = ["{remote_dir}/agent start-head --ray-dir {remote_dir}/ray --num-gpus {num_gpus}"]
    # Environment (NAME: value) of the agent and its workers, written into the launcher.
    env: dict[str, str] = {}
    # Stops exactly the node's Ray session (its workers end; their runs resume elsewhere): never
    # `ray stop`, which ends every Ray process of the machine.
    leave: list[str] = ["{remote_dir}/agent stop-head --ray-dir {remote_dir}/ray"]
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
            "num_gpus": str(num_gpus),
            "env": " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items()),
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


def bootstrap(shell: NodeShell, config: BootstrapConfig, num_gpus: int) -> str | None:
    """Install the worker environment on the node and start its own Ray; what fails is tagged with its
    step (check, upload, install, start) for the node's state. Returns the environment it found already
    installed (the install was skipped), or None."""
    with bootstrap_step("check"):
        venv = config.venv or image_environment(shell)
        ready = venv if venv is not None and holds_this_version(shell, venv) else None
        skip = {"install": [], "package": None, "wheelhouse": None} if ready else {}
        config = config.model_copy(update={"venv": venv, **skip})
        _check(config)
    with bootstrap_step("upload"):
        remote_package = _upload(shell, config)
    variables = config.variables(num_gpus, remote_package)
    with bootstrap_step("install"):
        run_steps(shell, config.install, variables, config.command_timeout_s)
    with bootstrap_step("start"):
        shell.put_text(f"{config.remote_dir}/agent", agent_launcher(config), mode=0o700)
        run_steps(shell, config.start, variables, config.command_timeout_s)
    return ready


def image_environment(shell: NodeShell) -> str | None:
    """The Python environment the worker image names in NODE_MARKER, or None (not that image)."""
    named = shell.run(f"cat {NODE_MARKER} 2>/dev/null || true", 60).stdout.strip()
    return named if _ENV_PATH.fullmatch(named) and ".." not in named.split("/") else None


def holds_this_version(shell: NodeShell, venv: str) -> bool:
    """Whether the node's environment `venv` (ABLATE_NODE_VENV, or the one the image names) holds this
    controller's code: its own Python says (an environment without orchestrator.version is older), the marker
    only says where to look."""
    found = shell.run(f"{shlex.quote(venv)}/bin/python -c {shlex.quote(_VERSION)}", 60, check=False)
    return found.exit_code == 0 and same_code(found.stdout.strip(), version_text())


def agent_launcher(config: BootstrapConfig) -> str:
    """The node's `{remote_dir}/agent`: the node agent in the node's environment. `serve` (the controller's
    channel) keeps stdout for the protocol and appends its stderr to {remote_dir}/agent.log."""
    v = config.variables(0)
    return (
        "#!/bin/sh\n# ablate's node agent (worker/agent.py), written by bootstrap.\n"
        f'if [ "$1" = serve ]; then exec 2>>"$HOME"/{v["remote_dir"]}/agent.log; fi\n'
        f'exec env {v["env"]} {v["venv"]}/bin/python -m worker.agent "$@"\n'
    )


def _check(config: BootstrapConfig) -> None:
    """What must hold before anything is copied: the settings the templates need."""
    needs_package = any("{package}" in t for t in config.install)
    if needs_package and config.package is None:
        raise NodeError("ABLATE_NODE_PACKAGE is not set: build one with `pip wheel --no-deps -w dist .`")


def _upload(shell: NodeShell, config: BootstrapConfig) -> str:
    """The package and the wheelhouse onto the node; returns the package's remote path."""
    # 0700 before anything goes in: the node's Ray token will live below it.
    shell.run(f"mkdir -p {shlex.quote(config.remote_dir)} && chmod 700 {shlex.quote(config.remote_dir)}", 60)
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
    """Stop the node's Ray; the node keeps its environment (running arms are re-queued elsewhere)."""
    run_steps(shell, config.leave, config.variables(0), config.command_timeout_s)


def teardown(shell: NodeShell, config: BootstrapConfig) -> None:
    """Stop the node's Ray and delete the working directory (copy checkpoints back first)."""
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


DETAIL_CHARS = 200  # of a failure's reason on the node's row (the whole is in its node.bootstrap_failed event)


def failure_detail(exc: BaseException) -> str:
    """Where a bootstrap failed and why, short enough for a table cell: `join: exit 126`, `install: timed out`,
    `upload: OSError: [Errno 21] Is a directory`, `connect: cannot connect to node 'a' (...): [Errno 111]
    Connection refused` (the command and its output are in the node's command events)."""
    step = getattr(exc, "bootstrap_step", "connect")
    if isinstance(exc, CommandFailed):
        return f"{step}: " + ("timed out" if exc.result.timed_out else f"exit {exc.result.exit_code}")
    reason = (error_reason(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"{step}: {reason[:DETAIL_CHARS]}"


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
            if not node.declared_gpus:
                raise NodeError(f"node {name!r}: no GPU count declared; declare it with "
                                f"`ablate nodes set {name} --gpus N` (the probe is the node's own word)")
            # Its Ray gets no more GPUs than the operator declared: the probe is the node's word.
            ready = bootstrap(shell, config, num_gpus=min(len(found["gpus"]), node.declared_gpus))
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
        if ready is not None:
            what = f"ablate {version_text()} is already installed in {ready} on the node: install skipped"
            session.add(Event(node_id=row.id, kind="node.install_skipped", message=what, data={"venv": ready}))
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
