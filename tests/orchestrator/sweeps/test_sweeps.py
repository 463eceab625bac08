"""Schedules fired by a controllable clock; sweeps provision, run, copy back and tear down over real SSH.

The runs' state changes that the launcher makes in production are made here directly in the
DB (queued -> running -> completed/stopped): the sweep runner watches only the DB, so that is the
boundary it has with whatever runs the runs.
"""

from __future__ import annotations

import json
import os
import pwd
import socket
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from orchestrator.db.models import Event, Grid, Metric, Run, Schedule, Sweep
from orchestrator.db.session import session_scope
from orchestrator.fleet.bootstrap import BootstrapConfig
from orchestrator.fleet.inventory import NodeCreate, add_node, find_node
from orchestrator.sweeps.runner import SweepRunner
from orchestrator.sweeps.schedules import (
    ScheduleCreate,
    ScheduleError,
    aware,
    create_schedule,
    get_schedule,
    pause_schedule,
    resume_schedule,
)
from orchestrator.vocabulary import RunState
from tests.kit.clock import FakeClock
from tests.kit.nodes import add_ssh_node
from tests.kit.readers import runs_by_arm

GRID = {"name": "nightly", "arms": ["A", "B"], "overrides": {"model": {"size": "tiny"}}}
DAY = datetime(2026, 1, 5, tzinfo=UTC)  # a Monday


@pytest.fixture(scope="module")
def ssh_node(database_url: str, sshd) -> str:  # noqa: ANN001
    """A node on the loopback OpenSSH server, for the sweeps that provision, copy back and tear down."""
    return add_ssh_node(database_url, sshd, "night-node")


@pytest.fixture(scope="module")
def node_name(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A registered node that is never contacted: the tests that only fire schedules need no SSH server."""
    key = tmp_path_factory.mktemp("keys") / "unused_ed25519"
    key.write_text("never read: no test using this node opens a connection\n")
    body = NodeCreate(name="paper-node", host="192.0.2.1", user="nobody", key_path=str(key), price_per_hour=2.0,
                      gpus=4)
    with session_scope(database_url) as session:
        add_node(session, body)
    return body.name


@pytest.fixture(autouse=True)
def _quiet_schedules(database_url: str) -> Iterator[None]:
    """Each test's clock jumps days ahead: pause the schedules of earlier tests so only its own fire."""
    with session_scope(database_url) as session:
        for schedule in session.scalars(select(Schedule)):
            schedule.paused = True
    yield


def _config(remote: Path, install: list[str] | None = None) -> BootstrapConfig:
    # A cheap real command sequence in place of venv + pip install; a recorded start in place of the node's
    # Ray head (tests/cluster starts real ones in namespaces).
    return BootstrapConfig(
        python=sys.executable,
        remote_dir=remote.relative_to(pwd.getpwuid(os.getuid()).pw_dir).as_posix(),  # login-relative
        install=install or ["{python} -c 'import sys; print(sys.version)'"],
        start=["echo {num_gpus} > {remote_dir}/joined"],
        leave=["rm -f {remote_dir}/joined"],
        command_timeout_s=60,
    )


def _schedule(database_url: str, name: str, node: str, now: datetime, **kw: object) -> None:
    body = ScheduleCreate(name=name, cron=kw.pop("cron", "0 22 * * *"), grid=GRID, nodes=[node], **kw)
    with session_scope(database_url) as session:
        create_schedule(session, body, now=now)


def _sweeps(database_url: str, schedule: str) -> list[Sweep]:
    with session_scope(database_url) as session:
        sid = get_schedule(session, schedule).id
        return list(session.scalars(select(Sweep).where(Sweep.schedule_id == sid).order_by(Sweep.id)))



def _set_run(database_url: str, run_id: int, **fields: object) -> None:
    """What the launcher and worker write while a run trains."""
    with session_scope(database_url) as session:
        run = session.get_one(Run, run_id)
        for key, value in fields.items():
            setattr(run, key, value)


def test_nightly_sweep_provisions_runs_copies_back_and_tears_down(
    database_url: str,
    sshd,  # noqa: ANN001
    ssh_node: str,
    tmp_path: Path,
) -> None:
    remote = sshd.workdir / "nightly"
    clock = FakeClock(DAY.replace(hour=12))
    _schedule(database_url, "nightly", ssh_node, clock.now)
    runner = SweepRunner(database_url, tmp_path / "storage", clock=clock, node_config=_config(remote))

    clock.now = DAY.replace(hour=21, minute=59)
    runner.tick()
    assert _sweeps(database_url, "nightly") == []  # not yet

    clock.now = DAY.replace(hour=22, minute=0, second=20)
    runner.tick()
    [sweep] = _sweeps(database_url, "nightly")
    assert (sweep.state, sweep.late, sweep.price_per_hour) == ("running", False, 2.0)
    assert (remote / "joined").read_text().split() == ["4"]  # bootstrapped with its 4 GPUs
    runs = runs_by_arm(database_url, sweep.grid_id)
    assert sorted(runs) == ["A", "B"] and {r.state for r in runs.values()} == {RunState.queued}
    with session_scope(database_url) as session:
        assert session.get_one(Grid, sweep.grid_id).source == "schedule"
        assert aware(get_schedule(session, "nightly").next_fire_at) == DAY.replace(day=6, hour=22)

    # The runs train on the node: A writes checkpoints there and both finish.
    ckpt = remote / "runs" / "A"
    (ckpt / "step_100").mkdir(parents=True)
    (ckpt / "step_100" / "model.pt").write_bytes(b"weights-A")
    (ckpt / "metrics.jsonl").write_text('{"step": 100, "recon_lpips": 0.95}\n')
    host = socket.gethostname()  # what the worker records as its node
    _set_run(database_url, runs["A"].id, state=RunState.running, node=host, checkpoint_dir=str(ckpt))
    with session_scope(database_url) as session:
        session.add(Metric(run_id=runs["A"].id, step=100, recon_lpips=0.95))
    clock.now = DAY.replace(hour=22, minute=30)
    runner.tick()
    assert _sweeps(database_url, "nightly")[0].state == "running"
    _set_run(database_url, runs["A"].id, state=RunState.completed)
    _set_run(database_url, runs["B"].id, state=RunState.completed, node=host)

    clock.now = DAY.replace(hour=23, minute=0, second=20)
    runner.tick()
    [sweep] = _sweeps(database_url, "nightly")
    assert sweep.state == "completed", sweep.error
    assert sweep.spend == pytest.approx(2.0, abs=1e-6)  # 1 h x 2.0/h
    results = Path(sweep.results_dir)
    copied = results / "runs" / f"{runs['A'].id}-A"
    assert (copied / "step_100" / "model.pt").read_bytes() == b"weights-A"
    assert (copied / "metrics.jsonl").exists()
    exported = json.loads((results / "metrics.json").read_text())
    assert [m["recon_lpips"] for m in next(r for r in exported["runs"] if r["arm"] == "A")["metrics"]] == [0.95]
    assert not remote.exists()  # torn down: left the cluster and removed the working dir
    with session_scope(database_url) as session:
        assert find_node(session, ssh_node).state == "registered"


def test_budget_cap_stops_the_sweep_gracefully(database_url: str, sshd, ssh_node: str, tmp_path: Path) -> None:  # noqa: ANN001
    remote = sshd.workdir / "budget"
    clock = FakeClock(DAY.replace(hour=12))
    _schedule(database_url, "capped", ssh_node, clock.now, cron="0 21 * * *", budget=3.0)
    runner = SweepRunner(database_url, tmp_path / "storage", clock=clock, node_config=_config(remote))

    clock.now = DAY.replace(hour=21)
    runner.tick()
    [sweep] = _sweeps(database_url, "capped")
    runs = runs_by_arm(database_url, sweep.grid_id)
    _set_run(database_url, runs["A"].id, state=RunState.running)  # B stays queued (no free GPU)

    clock.now = DAY.replace(hour=22)  # 1 h x 2.0 = 2.0 < 3.0
    runner.tick()
    [sweep] = _sweeps(database_url, "capped")
    assert (sweep.state, sweep.spend) == ("running", pytest.approx(2.0))
    assert not runs_by_arm(database_url, sweep.grid_id)["A"].stop_requested

    clock.now = DAY.replace(hour=22, minute=31)  # 1.52 h x 2.0 = 3.03 >= 3.0
    runner.tick()
    [sweep] = _sweeps(database_url, "capped")
    assert sweep.state == "stopping" and "budget 3 reached" in sweep.stop_reason
    runs = runs_by_arm(database_url, sweep.grid_id)
    assert runs["A"].stop_requested and runs["A"].state == RunState.running  # graceful: the launcher stops it
    assert runs["B"].state == RunState.stopped  # never started: stopped at once
    assert (remote / "joined").exists()  # nodes stay until the runs have stopped

    clock.now = DAY.replace(hour=22, minute=32)
    runner.tick()
    assert _sweeps(database_url, "capped")[0].state == "stopping"
    _set_run(database_url, runs["A"].id, state=RunState.stopped, decision="user")  # the launcher's graceful stop

    clock.now = DAY.replace(hour=22, minute=33)
    runner.tick()
    [sweep] = _sweeps(database_url, "capped")
    assert sweep.state == "stopped" and sweep.error is None
    assert sweep.spend == pytest.approx(2.0 * 93 / 60)
    assert not remote.exists()
    with session_scope(database_url) as session:
        kinds = [e.kind for e in session.scalars(select(Event).where(Event.grid_id == sweep.grid_id))]
    assert "sweep.budget" in kinds and "sweep.stopped" in kinds


def test_missed_fire_runs_once_late(database_url: str, node_name: str, tmp_path: Path) -> None:
    clock = FakeClock(DAY.replace(hour=12))
    _schedule(database_url, "late-once", node_name, clock.now, cron="0 2 * * *", misfire="run_once")
    runner = SweepRunner(database_url, tmp_path, clock=clock)

    # The controller was down from before 02:00 on the 6th until 05:00 on the 8th: three fires missed.
    [sweep_id] = runner.fire_due(datetime(2026, 1, 8, 5, tzinfo=UTC))
    [sweep] = _sweeps(database_url, "late-once")
    assert sweep.id == sweep_id and sweep.late and sweep.state == "provisioning"
    assert aware(sweep.scheduled_for) == datetime(2026, 1, 8, 2, tzinfo=UTC)  # once, for the latest missed fire
    with session_scope(database_url) as session:
        schedule = get_schedule(session, "late-once")
        assert aware(schedule.next_fire_at) == datetime(2026, 1, 9, 2, tzinfo=UTC)
        fired = session.scalars(select(Event).where(Event.kind == "schedule.fired")).all()
        assert any(e.data.get("schedule") == "late-once" and e.data["fire_times"] == 3 for e in fired)
        # Not run now: leave no active sweep for the other tests' runners.
        session.get_one(Sweep, sweep_id).state = "failed"


def test_missed_fire_skipped_then_next_fire_on_time(database_url: str, node_name: str, tmp_path: Path) -> None:
    clock = FakeClock(DAY.replace(hour=12))
    _schedule(database_url, "late-skip", node_name, clock.now, cron="0 2 * * *", misfire="skip")
    runner = SweepRunner(database_url, tmp_path, clock=clock)

    assert runner.fire_due(datetime(2026, 1, 6, 5, tzinfo=UTC)) == []  # 3 h late: skipped
    assert _sweeps(database_url, "late-skip") == []
    with session_scope(database_url) as session:
        assert aware(get_schedule(session, "late-skip").next_fire_at) == datetime(2026, 1, 7, 2, tzinfo=UTC)
        missed = session.scalars(select(Event).where(Event.kind == "schedule.missed")).all()
        assert any(e.data.get("schedule") == "late-skip" for e in missed)

    # Within the grace period a fire is on time, misfire=skip or not.
    [sweep_id] = runner.fire_due(datetime(2026, 1, 7, 2, 1, tzinfo=UTC))
    [sweep] = _sweeps(database_url, "late-skip")
    assert not sweep.late
    with session_scope(database_url) as session:
        session.get_one(Sweep, sweep_id).state = "failed"


def test_paused_schedule_does_not_fire_and_resume_skips_the_pause(
    database_url: str, node_name: str, tmp_path: Path
) -> None:
    _schedule(database_url, "pausable", node_name, DAY, cron="30 3 * * *")
    runner = SweepRunner(database_url, tmp_path)
    with session_scope(database_url) as session:
        pause_schedule(session, "pausable")
    assert runner.fire_due(datetime(2026, 1, 7, tzinfo=UTC)) == [] and _sweeps(database_url, "pausable") == []
    with session_scope(database_url) as session:
        resume_schedule(session, "pausable", now=datetime(2026, 1, 7, 12, tzinfo=UTC))
        assert aware(get_schedule(session, "pausable").next_fire_at) == datetime(2026, 1, 8, 3, 30, tzinfo=UTC)
    assert runner.fire_due(datetime(2026, 1, 7, 13, tzinfo=UTC)) == []  # the paused-over fires are not misfires


def test_failing_bootstrap_fails_the_sweep_with_the_command(
    database_url: str,
    sshd,  # noqa: ANN001
    ssh_node: str,
    tmp_path: Path,
) -> None:
    remote = sshd.workdir / "broken"
    clock = FakeClock(DAY.replace(hour=12))
    _schedule(database_url, "broken", ssh_node, clock.now, cron="0 20 * * *")
    config = _config(remote, install=["echo no space left on device >&2; exit 28", "touch {remote_dir}/never"])
    runner = SweepRunner(database_url, tmp_path, clock=clock, node_config=config)
    clock.now = DAY.replace(hour=20)
    runner.tick()
    [sweep] = _sweeps(database_url, "broken")
    assert sweep.state == "failed" and sweep.grid_id is None
    assert "exit 28" in sweep.error and "no space left on device" in sweep.error
    assert not (remote / "never").exists() and not remote.exists()  # stopped there, then torn down


def test_provisioning_error_other_than_node_error_fails_the_sweep_once(
    database_url: str,
    sshd,  # noqa: ANN001
    ssh_node: str,
    tmp_path: Path,
) -> None:
    remote = sshd.workdir / "upload"
    package = tmp_path / "ablate_dit-0.1-py3-none-any.whl"
    package.write_bytes(b"not really a wheel")
    # A directory where the package upload goes: SFTP's open fails with an OSError, not a NodeError.
    (remote / package.name).mkdir(parents=True)
    clock = FakeClock(DAY.replace(hour=12))
    _schedule(database_url, "upload", ssh_node, clock.now, cron="0 21 * * *")
    config = _config(remote, install=["{venv}/bin/pip install {package}"]).model_copy(update={"package": package})
    runner = SweepRunner(database_url, tmp_path, clock=clock, node_config=config)
    clock.now = DAY.replace(hour=21)
    runner.tick()
    [sweep] = _sweeps(database_url, "upload")
    assert sweep.state == "failed" and sweep.grid_id is None and sweep.finished_at is not None
    assert sweep.error.startswith(f"provisioning {ssh_node}: ") and "Error" in sweep.error
    assert not remote.exists()  # torn down: cleanup removed the working directory
    clock.now = DAY.replace(hour=21, minute=5)
    runner.tick()  # a failed sweep is not provisioned again
    [again] = _sweeps(database_url, "upload")
    assert again.state == "failed" and again.error == sweep.error
    with session_scope(database_url) as session:  # the failed bootstrap stays visible after the teardown
        node = find_node(session, ssh_node)
        # The step and the error as SFTP gave it (paramiko says only "Failure" for a directory in the way).
        assert (node.state, node.state_detail) == ("bootstrap_failed", "upload: OSError: Failure"), node.state_detail


def test_schedule_validation_names_the_field(database_url: str, node_name: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="cron"):
        ScheduleCreate(name="x", cron="every night", grid=GRID, nodes=[node_name])
    with pytest.raises(ValidationError, match="arms.1"):
        ScheduleCreate(name="x", cron="0 22 * * *", grid={"name": "g", "arms": ["A", "Z"]}, nodes=[node_name])
    with pytest.raises(ValidationError, match="budget"):
        ScheduleCreate(name="x", cron="0 22 * * *", grid=GRID, nodes=[node_name], budget=-1)
    with pytest.raises(ScheduleError, match="unknown node"), session_scope(database_url) as session:
        create_schedule(session, ScheduleCreate(name="x", cron="0 22 * * *", grid=GRID, nodes=["ghost"]))
    with session_scope(database_url) as session:
        assert session.scalar(select(Schedule).where(Schedule.name == "x")) is None


def test_schedules_over_rest(database_url: str, node_name: str) -> None:
    from fastapi.testclient import TestClient

    from orchestrator.app import create_app
    from orchestrator.settings import Settings

    client = TestClient(create_app(Settings(database_url=database_url), "tok"))
    auth = {"Authorization": "Bearer tok"}
    body = {"name": "rest-nightly", "cron": "0 23 * * 1-5", "grid": GRID, "nodes": [node_name], "budget": 40}

    assert client.post("/api/schedules", json=body).status_code == 401
    bad = client.post("/api/schedules", json={**body, "cron": "nightly"}, headers=auth)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "cron"]
    ghost = client.post("/api/schedules", json={**body, "nodes": ["ghost"]}, headers=auth)
    assert ghost.status_code == 422 and "ghost" in ghost.json()["detail"][0]["msg"]

    created = client.post("/api/schedules", json=body, headers=auth)
    assert created.status_code == 201, created.text
    assert created.json()["next_fire_at"] is not None and created.json()["sweeps"] == []
    assert client.post("/api/schedules", json=body, headers=auth).status_code == 409
    assert client.get("/api/schedules").status_code == 401  # sweep errors carry remote command output
    assert "rest-nightly" in [s["name"] for s in client.get("/api/schedules", headers=auth).json()]
    assert client.post("/api/schedules/rest-nightly/pause", headers=auth).json()["paused"] is True
    assert client.post("/api/schedules/rest-nightly/resume", headers=auth).json()["paused"] is False
    assert client.get("/api/schedules/nope", headers=auth).status_code == 404
    assert client.delete("/api/schedules/rest-nightly", headers=auth).status_code == 204
    assert client.get("/api/schedules/rest-nightly", headers=auth).status_code == 404


@pytest.mark.usefixtures("cli_controller")  # the commands ask a controller on the module's database
def test_schedules_cli(database_url: str, node_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml
    from typer.testing import CliRunner

    from orchestrator.cli import _register, app

    _register()
    monkeypatch.setenv("COLUMNS", "200")  # so the table does not wrap names
    grid_file = tmp_path / "grid.yaml"
    grid_file.write_text(yaml.safe_dump(GRID))
    runner = CliRunner()
    args = ["schedules", "create", "cli-nightly", "--cron", "0 22 * * *", "--grid", str(grid_file)]
    result = runner.invoke(app, [*args, "--nodes", node_name, "--budget", "25", "--misfire", "skip"])
    assert result.exit_code == 0, result.output
    assert "first fire" in result.output
    listed = runner.invoke(app, ["schedules", "list"])
    assert listed.exit_code == 0 and "cli-nightly" in listed.output and "skip" in listed.output
    assert runner.invoke(app, ["schedules", "pause", "cli-nightly"]).exit_code == 0
    with session_scope(database_url) as session:
        assert get_schedule(session, "cli-nightly").paused
    assert runner.invoke(app, ["schedules", "resume", "cli-nightly"]).exit_code == 0
    with session_scope(database_url) as session:
        assert not get_schedule(session, "cli-nightly").paused

    bad = runner.invoke(app, [*args[:2], "cli-bad", *args[3:], "--nodes", "ghost"])
    assert bad.exit_code != 0 and "unknown node" in str(bad.exception)
    bad = runner.invoke(app, [*args[:2], "cli-bad", *args[3:], "--nodes", node_name, "--misfire", "later"])
    assert bad.exit_code != 0 and "misfire" in str(bad.exception)
