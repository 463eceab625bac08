"""A controller killed with SIGKILL mid-grid and restarted: the grid completes, every checkpoint stored once.

The controller is `ablate serve` (API + launcher) in a subprocess joined to this module's Ray; its
workers are named, detached actors, so they train on while it is dead and the new one adopts them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import ray
from sqlalchemy import func, select

from orchestrator.db.models import Event, Metric, Run
from orchestrator.db.session import session_scope
from orchestrator.vocabulary import TERMINAL_STATES
from tests.kit.net import free_port
from tests.kit.polling import wait_for
from tests.kit.settings import tiny_overrides

NAMESPACE = "ablate-restart-test"
TOKEN = "restart-test-token"
INLINE = [{"parent": "A", "name": "A2"}, {"parent": "A", "name": "A3"}]
TINY = tiny_overrides(steps=60)


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    ray.init(num_gpus=4, num_cpus=2, namespace=NAMESPACE, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def start_controller(database_url: str, ray_address: str, storage: Path, log: Path, port: int) -> subprocess.Popen:
    """`ablate serve` (API + launcher) joined to this module's Ray."""
    env = {
        **os.environ,
        "ABLATE_API_TOKEN": TOKEN,
        "ABLATE_PORT": str(port),
        "ABLATE_DATABASE_URL": database_url,
        "ABLATE_RAY_ADDRESS": ray_address,
        "ABLATE_RAY_NAMESPACE": NAMESPACE,
        "ABLATE_HOME_DIR": str(storage),
        "ABLATE_LAUNCHER_INTERVAL_S": "0.2",
        "ABLATE_WORKER_THREADS": "1",
    }
    with log.open("ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-c", "from orchestrator.cli import main; main()", "serve"], env=env, stdout=fh, stderr=fh
        )



def _up(api: str) -> bool:
    try:
        return httpx.get(f"{api}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_controller_killed_mid_grid_and_restarted_loses_nothing(
    ray_address: str, database_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "controller.log"
    port = free_port()
    first = start_controller(database_url, ray_address, tmp_path, log, port)
    api = f"http://127.0.0.1:{port}"
    wait_for(lambda: _up(api), "the API", 60, 0.2, log, proc=first)
    resp = httpx.post(
        f"{api}/api/grids",
        # Five arms on four GPUs: the fifth is still queued when the controller dies.
        json={"name": "restart", "arms": ["A", "B", "C", *INLINE], "overrides": TINY},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert resp.status_code == 201, resp.text
    ids = [r["id"] for r in httpx.get(f"{api}/api/grids/{resp.json()['id']}").json()["runs"]]

    def metric_count() -> int:
        with session_scope(database_url) as session:
            return session.scalar(select(func.count()).select_from(Metric).where(Metric.run_id.in_(ids)))

    def states() -> list[str]:
        with session_scope(database_url) as session:
            return [session.get(Run, i).state for i in ids]

    try:
        wait_for(lambda: metric_count() >= 3, "three checkpoints", 120, 0.2, log, proc=first)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert states()[4] == "queued", "the kill must land mid-grid, with the fifth arm still waiting"
    killed_at = metric_count()
    # The workers train on with no controller; their records wait in the actors.
    second = start_controller(database_url, ray_address, tmp_path, log, port)
    try:
        complete = lambda: all(s in TERMINAL_STATES for s in states())  # noqa: E731
        wait_for(complete, "the grid to complete", 150, 0.2, log, proc=second)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=30)
    # A graceful shutdown on SIGTERM (uvicorn re-raises the signal once it has shut down).
    assert second.returncode in (0, -signal.SIGTERM) and "launcher: stopped" in log.read_text(), log.read_text()
    assert states() == ["completed"] * 5
    assert metric_count() > killed_at
    with session_scope(database_url) as session:
        for run_id in ids:
            steps = session.scalars(select(Metric.step).where(Metric.run_id == run_id).order_by(Metric.step)).all()
            assert steps == [10, 20, 30, 40, 50, 60], (run_id, steps)
            checkpoint_events = session.scalars(
                select(Event.data).where(Event.run_id == run_id, Event.kind == "checkpoint")
            ).all()
            assert sorted(e["step"] for e in checkpoint_events) == [10, 20, 30, 40, 50, 60]
            run = session.get(Run, run_id)
            assert run.retries == 0, "workers were adopted, not restarted"
            started = session.scalars(select(Event.id).where(Event.run_id == run_id, Event.kind == "started")).all()
            assert len(started) == 1, (run_id, "one worker per run, across the restart")
