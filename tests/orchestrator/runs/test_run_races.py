"""Run lifecycle edges on a real database (Postgres in CI), without Ray: a user's stop racing a launch,
a dying worker of a run being stopped, retries counted on every re-queue, an API that serves at once."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from sqlalchemy import select

from orchestrator.db.models import Event, Run
from orchestrator.db.session import session_factory, session_scope
from orchestrator.grids.service import GridCreate, create_grid, stop_run
from orchestrator.runs.launcher import Launcher
from orchestrator.runs.placement import Worker, claim_for_launch
from orchestrator.runs.run_end import requeue_run
from orchestrator.settings import Settings
from orchestrator.vocabulary import RunState


def _run(database_url: str, state: RunState = RunState.queued, **values: object) -> int:
    with session_scope(database_url) as session:
        run = create_grid(session, GridCreate(name="race", arms=["A"])).runs[0]
        run.state = state
        for key, value in values.items():
            setattr(run, key, value)
        session.flush()
        return run.id


def _kinds(database_url: str, run_id: int) -> list[str]:
    with session_scope(database_url) as session:
        return list(session.scalars(select(Event.kind).where(Event.run_id == run_id).order_by(Event.id)))


def _launcher(database_url: str, tmp_path: Path, max_retries: int = 2) -> Launcher:
    return Launcher(Settings(database_url=database_url, home_dir=tmp_path, max_retries=max_retries))


def test_a_stop_that_commits_first_keeps_the_launch_from_claiming_the_run(database_url: str) -> None:
    run_id = _run(database_url)
    make = session_factory(database_url)
    with make() as launcher_session, make() as api_session:
        # Both read the run as queued; the user's stop commits first.
        launching = launcher_session.get(Run, run_id)
        assert launching.state == RunState.queued
        stop_run(api_session, api_session.get(Run, run_id))
        api_session.commit()
        assert not claim_for_launch(launcher_session, launching, "/nowhere"), "a stopped run must not launch"
        launcher_session.commit()
        assert launching.state == RunState.stopped  # the loser sees the winner's state
    with session_scope(database_url) as session:
        run = session.get(Run, run_id)
        assert (run.state, run.decision, run.stop_requested) == (RunState.stopped, "user", False)
        assert run.finished_at is not None and run.started_at is None and run.checkpoint_dir is None
    assert _kinds(database_url, run_id) == ["stopped"]


def test_a_stop_that_loses_to_the_launch_asks_the_launcher_to_stop_the_worker(database_url: str) -> None:
    run_id = _run(database_url)
    make = session_factory(database_url)
    with make() as launcher_session, make() as api_session:
        launching = launcher_session.get(Run, run_id)
        stale = api_session.get(Run, run_id)
        assert stale.state == RunState.queued  # what the API saw before the launch committed
        assert claim_for_launch(launcher_session, launching, "/ckpt/dir")
        launcher_session.commit()
        stop_run(api_session, stale)
        api_session.commit()
    with session_scope(database_url) as session:
        run = session.get(Run, run_id)
        # Not a "stopped" run with a live worker: the launch stands and the launcher is told to stop it.
        assert (run.state, run.stop_requested, run.decision) == (RunState.starting, True, None)
        assert run.finished_at is None and run.checkpoint_dir == "/ckpt/dir" and run.started_at is not None
    assert _kinds(database_url, run_id) == ["stop_requested"]


def test_a_detector_stopped_run_whose_worker_dies_is_finished_not_relaunched(
    database_url: str, tmp_path: Path
) -> None:
    run_id = _run(database_url, RunState.running, decision="collapse", decision_reason="worse twice")
    launcher = _launcher(database_url, tmp_path)
    launcher._worker_died(Worker(run_id, "ablate-run-x-0", None, None), RuntimeError("node lost"))
    with session_scope(database_url) as session:
        run = session.get(Run, run_id)
        assert (run.state, run.retries, run.decision) == (RunState.stopped, 0, "collapse")
    kinds = _kinds(database_url, run_id)
    assert kinds[-1] == "stopped" and "worker_lost" not in kinds


def test_a_user_stopped_run_whose_worker_dies_is_finished_not_relaunched(database_url: str, tmp_path: Path) -> None:
    run_id = _run(database_url, RunState.running, stop_requested=True)
    _launcher(database_url, tmp_path)._worker_died(Worker(run_id, "w", None, None), RuntimeError("gone"))
    with session_scope(database_url) as session:
        run = session.get(Run, run_id)
        assert (run.state, run.retries) == (RunState.stopped, 0)


def test_every_lost_worker_counts_a_retry_until_the_run_fails(database_url: str, tmp_path: Path) -> None:
    run_id = _run(database_url, RunState.running)
    with session_scope(database_url) as session:
        requeue_run(session, session.get(Run, run_id), "worker w not found after a controller restart", 1)
    with session_scope(database_url) as session:
        run = session.get(Run, run_id)
        assert (run.state, run.retries) == (RunState.queued, 1)
        run.state = RunState.running
    with session_scope(database_url) as session:
        requeue_run(session, session.get(Run, run_id), "worker w not found after a controller restart", 1)
    with session_scope(database_url) as session:
        run = session.get(Run, run_id)
        assert (run.state, run.retries) == (RunState.failed, 2)
        assert "not found after a controller restart" in run.error and run.finished_at is not None


def test_the_api_serves_while_ray_is_still_unreachable(database_url: str, tmp_path: Path) -> None:
    """The launcher joins Ray in its own thread: a cluster that is slow or down must not hold the API."""
    script = textwrap.dedent(
        """
        import os, sys
        from fastapi.testclient import TestClient
        from orchestrator.app import create_app
        from orchestrator.server import attach_launcher
        from orchestrator.settings import Settings

        # Port 9 (discard): nothing listens, so joining this "cluster" fails or hangs.
        settings = Settings(database_url=sys.argv[1], home_dir=sys.argv[2], ray_address="127.0.0.1:9")
        app = create_app(settings, "token")
        attach_launcher(app)
        with TestClient(app) as client:
            print("healthz", client.get("/healthz").status_code, flush=True)
            os._exit(0)  # skip the shutdown hook's join of a thread still trying to reach Ray
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, database_url, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "healthz 200" in proc.stdout, proc.stdout + proc.stderr[-3000:]
