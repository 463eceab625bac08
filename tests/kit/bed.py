"""The namespace test bed (tests/cluster/testbed.py) with this checkout's Python and source on its nodes,
and what tests and bench/ scripts run on it.

`worker_bed` (nodes that reach this Python, its virtualenv and the source), `node_config` (bootstrap with
the pre-built environment), `register_node` (a bed node as the controller's node row), `launcher_process`
(the real launcher in its own process), `aws_profile` (the usual credentials files in a node user's home,
for the bed's S3), `lose_node` (a node dies: its processes killed, its link down).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator.db.session import session_scope
from orchestrator.fleet.bootstrap import BootstrapConfig
from orchestrator.fleet.inventory import NodeCreate, add_node
from tests.cluster.testbed import BedNode, TestBed
from worker.node_ray import session_pids

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "worker", "model", "arms", "migrations")

# S3 for tests that store checkpoints or data on the bed (moto; nothing leaves the machine).
BUCKET = "ablate-bed"
CREDENTIALS = ("ablate-bed", "ablate-bed-secret")  # moto accepts any; nothing leaves the machine


@contextmanager
def worker_bed(nodes: int) -> Iterator[TestBed]:
    """A bed of `nodes` firewalled nodes (2 logical GPUs each) whose nodes (now and added later) reach this
    Python, its virtualenv and the source; the controller's storage dir is node-local on each node, as on
    rented machines. Raises TestBedUnavailable when this machine cannot host a bed."""
    TestBed.check()
    tag = f"ab{os.getpid() % 100000}"
    storage = Path("/tmp") / tag / "controller" / "storage"
    with TestBed(
        nodes=nodes, gpus=2, tag=tag, private_paths=[storage], readable=[Path(sys.base_prefix), Path(sys.prefix)],
        firewall=True,
    ) as bed:
        src = bed.root / "src"
        for package in PACKAGES:
            shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
        bed.storage = storage  # type: ignore[attr-defined]
        bed.src = src  # type: ignore[attr-defined]
        yield bed


def node_config(testbed: TestBed, **overrides: object) -> BootstrapConfig:
    """The default start and leave, with the pre-built environment instead of an install."""
    values: dict[str, object] = {
        "venv": sys.prefix,
        "python": sys.executable,
        "install": [],
        "env": {"PYTHONPATH": str(testbed.src)},  # type: ignore[attr-defined]
        "command_timeout_s": 120,
    }
    return BootstrapConfig(**{**values, **overrides})


def register_node(database_url: str, node: BedNode, name: str | None = None, price_per_hour: float = 0.0) -> str:
    """The bed node as the controller's node row (its address, login user, key and known host key); its name."""
    name = name or node.name
    with session_scope(database_url) as session:
        add_node(
            session,
            NodeCreate(
                name=name,
                host=node.ip,
                user=node.user,
                key_path=str(node.client_key),
                known_hosts_path=str(node.known_hosts),
                price_per_hour=price_per_hour,
                gpus=node.gpus,
            ),
        )
    return name


@contextmanager
def launcher_process(
    database_url: str,
    storage: Path,
    log_path: Path,
    namespace: str,
    module: str = "orchestrator.loop",
    **env: str,
) -> Iterator[subprocess.Popen[bytes]]:
    """The real launcher in its own process (`python -m orchestrator.loop`, or `module`: a
    controller that also runs sweeps), training on the joined bed nodes only (no local node); `env` adds
    settings (ABLATE_...). Its output goes to `log_path` (appended: a restarted controller writes after
    the killed one), kept for a failure's post-mortem. Terminated (then killed) on exit."""
    full_env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "ABLATE_DATABASE_URL": database_url,
        "ABLATE_LOCAL_NODE": "false",
        "ABLATE_NODE_LOST_S": "20",
        "ABLATE_HOME_DIR": str(storage),
        "ABLATE_LAUNCHER_INTERVAL_S": "0.3",
        "ABLATE_WORKER_THREADS": "1",
        "ABLATE_RAY_NAMESPACE": f"{namespace}-{os.getpid()}",
        **env,
    }
    with log_path.open("ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", module], env=full_env, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def aws_profile(node: BedNode) -> None:
    """The usual credentials and config files in the node user's home, readable by that user only."""
    aws = node.home / ".aws"
    aws.mkdir(mode=0o700, exist_ok=True)
    (aws / "credentials").write_text(
        f"[default]\naws_access_key_id = {CREDENTIALS[0]}\naws_secret_access_key = {CREDENTIALS[1]}\n"
    )
    (aws / "config").write_text("[default]\nregion = us-east-1\n")
    for path in (aws, aws / "credentials", aws / "config"):
        os.chown(path, node.uid, node.uid)
        path.chmod(0o700 if path.is_dir() else 0o600)


def lose_node(testbed: TestBed, node: BedNode) -> None:
    """The node dies: every process of its Ray session and of its user SIGKILLed, then its link down."""
    sid = int((node.home / "ablate" / "ray" / "session").read_text())
    for pid in session_pids(sid) + testbed.node_processes(node):
        if Path(f"/proc/{pid}/comm").exists() and Path(f"/proc/{pid}/comm").read_text().strip() != "sshd":
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    veth = f"{testbed.tag}v{testbed.nodes.index(node)}"
    subprocess.run(["ip", "link", "set", "dev", veth, "down"], check=True, capture_output=True, timeout=30)
