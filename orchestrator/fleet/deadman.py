"""Arming the dead-man's switch on a rented node: after its deadline the node ends itself, whether or
not the controller is alive to destroy it (a controller that died for good, a network split).

The switch is orchestrator/fleet/deadman_node.py, copied over SFTP and started with the node's Python in
its own session. At the deadline it destroys its instance through the provider's API with the key the
provider scoped to that instance (Vast's CONTAINER_API_KEY, RunPod's RUNPOD_API_KEY), then runs the stop
command (ABLATE_RENT_DEADMAN_COMMAND). The account's API key never goes to a node: a rented machine is
someone else's computer. docs/operations.md says what still bills after a stop, per provider.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from orchestrator.fleet.errors import NodeError
from orchestrator.fleet.shell import NodeShell

REMOTE_SCRIPT = ".ablate-deadman.py"  # in the login directory, outside the working dir teardown deletes
DEFAULT_API_URLS = {"vast": "https://console.vast.ai", "runpod": "https://api.runpod.io"}


@dataclass(frozen=True)
class DeadmanConfig:
    """When and how a rented node ends itself. Settings: ABLATE_RENT_DEADMAN_*."""

    # Run through `sh -c` at the deadline, after the provider call. Powering off ends a Vast/RunPod
    # container's compute billing; tests replace it with touching a file.
    command: str = "sudo -n poweroff || poweroff || shutdown -h now"
    # After the budget's end: the runner's own stop grace (30 min) plus copy-back and teardown.
    grace_s: float = 3600.0
    # A sweep without a budget has no end in money: its nodes end this long after the fire.
    without_budget_s: float = 24 * 3600.0
    python: str = "python3"  # the node's Python (bootstrap checks its version later)
    # Off only where the "rented node" is the controller's own machine (tests on a loopback sshd): a
    # switch there would outlive the test. The sweep's events say so; a real rental is always armed.
    enabled: bool = True


@dataclass(frozen=True)
class Armed:
    """A switch that runs: its pid on the node, the deadline, and how it will end the node (in words)."""

    pid: int
    deadline: datetime
    how: str


def api_url(provider: object) -> str:
    """The provider API base URL the node calls (the controller's own setting, e.g. a simulator's)."""
    name = getattr(provider, "name", "")
    return getattr(provider, "server_url", None) or getattr(provider, "api_url", None) or DEFAULT_API_URLS.get(name, "")


def arm(shell: NodeShell, provider: object, instance_id: str, deadline: datetime, config: DeadmanConfig) -> Armed:
    """Copy the switch to the node and start it; NodeError when it does not report a pid."""
    if not config.enabled:
        return Armed(0, deadline, "is NOT armed: the dead-man's switch is off (ABLATE_RENT_DEADMAN_ENABLED=false)")
    name = getattr(provider, "name", "")
    shell.put(Path(__file__).with_name("deadman_node.py"), REMOTE_SCRIPT, mode=0o700)
    command = " ".join(
        [
            shlex.quote(config.python),
            REMOTE_SCRIPT,
            f"--deadline {math.ceil(deadline.timestamp())}",  # whole seconds, never early
            f"--provider {shlex.quote(name)}",
            f"--instance {shlex.quote(instance_id)}",
            f"--api-url {shlex.quote(api_url(provider))}",
            f"--command {shlex.quote(config.command)}",
        ]
    )
    out = shell.run(command, timeout_s=60).stdout.strip()
    if not out.isdigit():
        raise NodeError(f"the dead-man's switch did not start on {shell.name!r}: {out[:300]!r}")
    scoped = {"vast": "its CONTAINER_API_KEY", "runpod": "its RUNPOD_API_KEY"}.get(name)
    how = f"destroys itself through the {name} API with {scoped} (scoped to this instance), then " if scoped else ""
    return Armed(int(out), deadline, how + f"runs `{config.command}`")


def arm_node(
    database_url: str, name: str, provider: object, instance_id: str, deadline: datetime, config: DeadmanConfig
) -> Armed:
    """`arm` on the registered node `name`, over its pinned SSH connection."""
    from orchestrator.db.session import session_scope
    from orchestrator.fleet.inventory import get_node

    with session_scope(database_url) as session:
        node = get_node(session, name)
        session.expunge(node)
    with NodeShell.open(node, database_url) as shell:
        return arm(shell, provider, instance_id, deadline, config)
