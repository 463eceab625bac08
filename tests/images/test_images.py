"""docker/'s images, built from the repository and run on this machine with Podman (tests/images/podman.py).

The worker image runs as a node would on a provider: its own network namespace, reachable only through
its published SSH port, with a host key it made at start (pinned by the test as docs/operations.md
says). The controller image serves on the host's network against this run's database (the CI's
Postgres, else SQLite in its state volume), reaches the worker over SSH alone, bootstraps it (the image
already holds this version: no install) and trains a grid there. Only `nvidia-smi` is a stand-in (the
test bed's, two logical GPUs): the arms train on the CPU torch the test builds in.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from sqlalchemy import select

from orchestrator.db.models import Event
from orchestrator.db.session import session_scope
from orchestrator.vocabulary import TERMINAL_STATES, RunState
from tests.cluster.testbed import stand_in_nvidia_smi
from tests.images.podman import CONTROLLER, WORKER, Built, Podman
from tests.kit.net import free_port
from tests.kit.polling import wait_for
from tests.kit.settings import tiny_overrides

TOKEN = "image-test-token-0123456789abcdef"


@contextmanager
def container(podman: Podman, image: str, *args: str) -> Iterator[str]:
    """A detached container of `image`; removed (its logs printed, for a failure's post-mortem) on exit."""
    cid = podman("run", "-d", *args, image).stdout.strip()
    try:
        yield cid
    finally:
        print(podman("logs", "--tail", "40", cid, check=False).stdout[-4000:])
        podman("rm", "-f", "-t", "2", cid, check=False)


def _listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _host_key(port: int) -> str:
    scan = subprocess.run(["ssh-keyscan", "-p", str(port), "127.0.0.1"], capture_output=True, text=True, timeout=30)
    return scan.stdout if "ssh-ed25519" in scan.stdout else ""


def test_a_grid_runs_through_the_controller_image_on_a_worker_image(
    images: tuple[Podman, dict[str, Built]], database_url: str, tmp_path: Path
) -> None:
    podman, _ = images
    ssh = tmp_path / "ssh"
    ssh.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh / "key")], check=True)
    smi = stand_in_nvidia_smi(tmp_path / "nvidia-smi", gpus=2)
    ssh_port, api_port = free_port(), free_port()
    worker_args = [
        "--shm-size", "1g",  # Ray's object store
        "-p", f"127.0.0.1:{ssh_port}:22",  # SSH is all a provider's NAT lets in
        "-e", f"ABLATE_SSH_AUTHORIZED_KEY={(ssh / 'key.pub').read_text().strip()}",
        "-v", f"{smi}:/usr/local/bin/nvidia-smi:ro",
    ]
    with container(podman, WORKER, *worker_args):
        (ssh / "known_hosts").write_text(wait_for(lambda: _host_key(ssh_port), "the worker's sshd", timeout=60))

        state = tmp_path / "state"
        state.mkdir()
        postgres = database_url.startswith("postgresql")
        db_in_container = database_url if postgres else "sqlite:////var/lib/ablate/ablate.db"
        db_on_host = database_url if postgres else f"sqlite:///{state}/ablate.db"
        controller_args = [
            "--network", "host",  # as in docker/compose.yaml
            "-e", f"ABLATE_DATABASE_URL={db_in_container}",
            "-e", f"ABLATE_PORT={api_port}",
            "-e", "ABLATE_HOST=127.0.0.1",
            "-e", f"ABLATE_API_TOKEN={TOKEN}",
            "-e", "ABLATE_OFFLINE=1",  # tests never download weights; the nodes' agents get it too:
            "-e", 'ABLATE_NODE_ENV={"ABLATE_OFFLINE": "1"}',
            "-v", f"{ssh}:/ssh:ro",
            "-v", f"{state}:/var/lib/ablate",
        ]
        with container(podman, CONTROLLER, *controller_args):
            api = httpx.Client(base_url=f"http://127.0.0.1:{api_port}", headers={"Authorization": f"Bearer {TOKEN}"})
            wait_for(lambda: _listens(api_port), "the controller's API", timeout=120)
            node = {
                "name": "worker-image", "host": "127.0.0.1", "port": ssh_port, "user": "root",
                "key_path": "/ssh/key", "known_hosts_path": "/ssh/known_hosts", "gpus": 2,
            }
            added = api.post("/api/nodes", json=node)
            assert added.status_code == 201, added.text
            joined = api.post("/api/nodes/worker-image/bootstrap", timeout=300)
            assert joined.status_code == 200, joined.text
            assert joined.json()["state"] == "joined"
            assert len(joined.json()["gpus"]) == 2

            body = {"name": "in-images", "arms": ["A", "B"], "overrides": tiny_overrides(20)}
            created = api.post("/api/grids", json=body)
            assert created.status_code == 201, created.text
            grid_id = created.json()["id"]

            def finished() -> bool:
                runs = api.get(f"/api/grids/{grid_id}").json()["runs"]
                return all(r["state"] in TERMINAL_STATES for r in runs)

            wait_for(finished, "the grid", timeout=600, interval=0.5)
            runs = [api.get(f"/api/runs/{r['id']}").json() for r in api.get(f"/api/grids/{grid_id}").json()["runs"]]

    assert [(r["arm"], r["state"], r["nodes"]) for r in runs] == [
        ("A", RunState.completed, ["worker-image"]),
        ("B", RunState.completed, ["worker-image"]),
    ], [r["error"] for r in runs]
    assert all(r["best_step"] is not None for r in runs)
    with session_scope(db_on_host) as session:
        skipped = session.scalars(select(Event).where(Event.kind == "node.install_skipped")).all()
        assert [e.data["venv"] for e in skipped] == ["/opt/venv"]  # the image's environment, no install
