"""What a node has: its GPUs (nvidia-smi), free disk and Python, stored on its inventory row."""

from __future__ import annotations

import csv
from typing import Any

from orchestrator.db.models import utcnow
from orchestrator.db.session import session_scope
from orchestrator.fleet.errors import NodeError
from orchestrator.fleet.inventory import get_node
from orchestrator.fleet.shell import NodeShell
from orchestrator.vocabulary import NodeState

GPU_QUERY = "nvidia-smi --query-gpu=index,name,memory.total,driver_version,uuid --format=csv,noheader,nounits"


def parse_gpus(text: str) -> list[dict[str, Any]]:
    """nvidia-smi CSV (index, name, memory MiB, driver, uuid) -> one dict per GPU; memory in MiB."""
    gpus = []
    for row in csv.reader(line for line in text.splitlines() if line.strip()):
        if len(row) != 5:
            raise NodeError(f"unexpected nvidia-smi line {','.join(row)!r}; expected index,name,memory,driver,uuid")
        index, name, memory, driver, uuid = (c.strip() for c in row)
        gpus.append(
            {"index": int(index), "name": name, "memory_mib": int(float(memory)), "driver": driver, "uuid": uuid}
        )
    return gpus


def probe(shell: NodeShell, timeout_s: float = 60.0) -> dict[str, Any]:
    """GPUs (from nvidia-smi), free disk of the login directory (GB), the remote python3 version and when
    (probed_at: `nodes probe` and `nodes bootstrap` both probe, and both show it)."""
    gpus = parse_gpus(shell.run(GPU_QUERY, timeout_s).stdout)
    df = shell.run("df -Pk .", timeout_s).stdout.splitlines()
    try:
        free_kib = int(df[-1].split()[3])
    except (IndexError, ValueError):
        raise NodeError(f"node {shell.name!r}: cannot read free disk from `df -Pk .`: {df!r}") from None
    python = shell.run("python3 -c 'import platform; print(platform.python_version())'", timeout_s).stdout.strip()
    hostname = shell.run("hostname", timeout_s).stdout.strip()
    return {
        "node": shell.name,
        "hostname": hostname,
        "gpus": gpus,
        "free_disk_gb": round(free_kib * 1024 / 1e9, 2),
        "python": python,
        "probed_at": utcnow().isoformat(),
    }


def probe_node(database_url: str, name: str) -> dict[str, Any]:
    """Probe a registered node and store the result on it (state "ready"); returns the probe JSON."""
    with session_scope(database_url) as session:
        node = get_node(session, name)
        session.expunge(node)
    with NodeShell.open(node, database_url) as shell:
        result = probe(shell)
    with session_scope(database_url) as session:
        row = get_node(session, name)
        row.gpus = result["gpus"]
        row.last_probe = result
        if row.state == NodeState.registered:
            row.state = NodeState.ready
    return result
