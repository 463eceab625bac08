"""Checkpoints that outlive the node, with real servers: SFTP to a real OpenSSH server on loopback (the
controller's side), S3 against moto's S3-compatible server on loopback, the launcher on a real local
Ray, the sweep's copy-back from storage and the dashboard's alarm for a run whose checkpoints are not
being stored. Nothing reaches outside the machine."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from orchestrator.dashboard.data import grid_detail, grid_version
from orchestrator.db.events import record_event
from orchestrator.db.models import Event, Grid, Metric, Run
from orchestrator.db.session import session_scope
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.runs.ingest import ingest
from orchestrator.runs.storage import LOG_CAPPED, MAX_STORAGE_EVENTS, record_storage, seen_seq, storage_alarms
from orchestrator.sweeps.copy_back import copy_back, results_report
from tests.kit.polling import wait_for
from tests.kit.readers import all_ended, events_of, stored_step
from tests.kit.settings import tiny_overrides
from worker.actor import ArmWorker
from worker.checkpoint_store import CheckpointStore, StoreConfig, open_fs
from worker.protocol import StorageStatus

TINY = tiny_overrides(steps=30)
AWS_ENV = {"AWS_ACCESS_KEY_ID": "ablate-test", "AWS_SECRET_ACCESS_KEY": "ablate-test-secret",
           "AWS_DEFAULT_REGION": "us-east-1"}


def tiny_spec(steps: int = 30) -> dict[str, Any]:
    from orchestrator.grids.arms import deep_merge, resolve

    over = deep_merge(TINY, {"schedule": {"steps": steps}})
    return resolve("A", over).model_dump(mode="json")


def finish(worker: ArmWorker) -> dict[str, Any]:
    reply = wait_for(lambda: (r := worker.poll(None, 0.5))["state"] != "running" and r, "the worker to finish")
    assert reply["state"] == "done", reply["error"]
    return reply


def test_a_node_without_paramiko_trains_and_stores_to_a_file_store(tmp_path: Path) -> None:
    """A GPU node with a file:// (or s3://) store needs no SSH stack: the worker imports and uploads with
    paramiko made unimportable (a fresh interpreter, so this process's paramiko cannot leak in)."""
    code = f"""
import sys
sys.modules["paramiko"] = None  # import paramiko now raises ImportError
from worker.checkpoint_store import CheckpointStore, StoreConfig, open_fs
import worker.train, worker.actor
fs, root = open_fs("file://{tmp_path}/store/run-1")
fs.makedirs(root, exist_ok=True)
fs.pipe(root + "/probe.txt", b"ok")
print(fs.cat(root + "/probe.txt").decode())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "ok"


# -- SFTP to the controller: a real OpenSSH server -------------------------------------------------------


def sftp_store(sshd, name: str) -> tuple[str, dict[str, Any]]:  # noqa: ANN001
    url = f"sftp://{sshd.user}@{sshd.host}:{sshd.port}{sshd.workdir}/{name}"
    return url, {"key_filename": str(sshd.client_key), "known_hosts": str(sshd.known_hosts)}


def test_sftp_store_and_resume_on_a_fresh_node(sshd, tmp_path: Path) -> None:  # noqa: ANN001
    url, options = sftp_store(sshd, "ckpts/run-1")
    storage = {"url": url, "options": options, "keep_last": 1}
    first = ArmWorker(1, tiny_spec(), str(tmp_path / "node1"), storage=storage)
    wait_for(lambda: first.poll(None, 0.5)["records"], "a first checkpoint")
    first.request_stop()
    stopped = finish(first)
    stop_step = stopped["records"][-1]["step"]
    on_server = sshd.workdir / "ckpts" / "run-1"
    assert (on_server / f"ckpt_{stop_step:07d}.pt").read_bytes() == (
        tmp_path / "node1" / f"ckpt_{stop_step:07d}.pt"
    ).read_bytes()
    assert (on_server / "best.pt").exists() and (on_server / "records.jsonl").exists()

    done = finish(ArmWorker(1, tiny_spec(), str(tmp_path / "node2"), storage=storage))
    assert [r["step"] for r in done["records"]] == sorted({10, 20, 30, stop_step})
    assert any(e["kind"] == "checkpoint.fetched" and e["data"]["step"] == stop_step for e in done["storage"]["log"])
    # keep_last=1: the newest periodic checkpoint and best.pt (with every evaluation's samples); no temp file.
    assert sorted(p.name for p in on_server.iterdir()) == ["best.pt", "ckpt_0000030.pt", "metrics.jsonl",
                                                           "records.jsonl", "samples"]


def test_sftp_server_with_an_unknown_host_key_is_refused_and_recorded(sshd, tmp_path: Path) -> None:  # noqa: ANN001
    url, options = sftp_store(sshd, "refused")
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    out = tmp_path / "node"
    out.mkdir()
    (out / "ckpt_0000010.pt").write_bytes(b"weights")
    store = CheckpointStore(StoreConfig(url=url, options={**options, "known_hosts": str(empty)}), out)
    try:
        store.offer(10, is_best=True)
        status = wait_for(lambda: (s := store.status())["failures"] and s, "the refused upload")
    finally:
        store.close()
    assert status["stored_step"] is None and status["pending_step"] == 10
    assert "is not in" in status["last_error"] and str(empty) in status["last_error"]
    assert not (sshd.workdir / "refused").exists()


# -- the launcher on a real Ray, checkpoints in S3 ----------------------------------------------------------


@pytest.fixture(scope="module")
def ray_with_aws_env() -> Iterator[Any]:
    """A local Ray whose workers see the usual AWS variables (they inherit the driver's environment)."""
    import ray

    saved = {k: os.environ.get(k) for k in AWS_ENV}
    os.environ.update(AWS_ENV)
    ray.init(num_gpus=4, num_cpus=2, namespace="ablate-storage-test", include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v




def test_a_lost_worker_whose_disk_is_gone_resumes_from_s3(
    ray_with_aws_env: Any, s3_endpoint: str, database_url: str, tmp_path: Path
) -> None:
    """Kill a worker mid-run and take its local checkpoint directory away (a lost node): the re-queued
    run resumes from the newest checkpoint in S3, its metrics are contiguous with none duplicated, and
    every value equals its twin's, trained uninterrupted from the same seed in the same grid."""
    from orchestrator.runs.launcher import Launcher
    from orchestrator.runs.placement import run_dir
    from orchestrator.settings import Settings
    from worker.worker_names import worker_name

    ray = ray_with_aws_env
    options = {"endpoint_url": s3_endpoint}
    fs, _ = open_fs("s3://ablate-ckpts", options)
    fs.mkdir("ablate-ckpts")
    settings = Settings(
        database_url=database_url,
        home_dir=tmp_path,
        launcher_interval_s=0.2,
        worker_threads=1,
        ray_namespace="ablate-storage-test",
        checkpoint_url="s3://ablate-ckpts/nightly",
        checkpoint_options=options,
        checkpoint_keep_last=1,
        ray_address=ray.get_runtime_context().gcs_address,  # the local node's agent joins this module's Ray
    )
    overrides = {**TINY, "schedule": {**TINY["schedule"], "steps": 60}}
    with session_scope(database_url) as session:
        grid = create_grid(session, GridCreate(name="lost", arms=["A", {"parent": "A", "name": "A-twin"}],
                                               overrides=overrides))
        lost_id, twin_id = (r.id for r in grid.runs)
    launcher = Launcher(settings)
    launcher.start()
    try:
        wait_for(lambda: stored_step(database_url, lost_id) >= 20, "two checkpoints of the run in S3")
        worker = ray.get_actor(worker_name(lost_id, 0), namespace="ablate-storage-test")
        pid = ray.get(worker.ping.remote())["pid"]
        # Freeze it, take its disk away, then kill it: the new worker finds no local checkpoint.
        os.kill(pid, signal.SIGSTOP)
        local = run_dir(settings, lost_id)
        shutil.move(local, tmp_path / "lost-disk")
        os.kill(pid, signal.SIGKILL)
        in_storage = stored_step(database_url, lost_id)
        wait_for(lambda: all_ended(database_url, [lost_id, twin_id]), "both runs to finish", timeout=240)
    finally:
        launcher.stop()
    with session_scope(database_url) as session:
        lost, twin = session.get(Run, lost_id), session.get(Run, twin_id)
        assert (lost.state, lost.retries, twin.state) == ("completed", 1, "completed"), lost.error
        assert lost.checkpoint_url.startswith(f"s3://ablate-ckpts/nightly/run-{lost_id}-")
        assert lost.nodes == ["local"]  # the controller's own machine, by the controller's name for it
        a = session.scalars(select(Metric).where(Metric.run_id == lost_id).order_by(Metric.step)).all()
        b = session.scalars(select(Metric).where(Metric.run_id == twin_id).order_by(Metric.step)).all()
        assert [m.step for m in a] == [m.step for m in b] == list(range(10, 61, 10)), "contiguous, none twice"
        for ma, mb in zip(a, b, strict=True):  # the CPU trainer is bit-identical across a resume
            assert (ma.train_loss, ma.grad_norm, ma.recon_lpips) == (mb.train_loss, mb.grad_norm, mb.recon_lpips)
        url = lost.checkpoint_url
    events = events_of(database_url, lost_id)
    kinds = [e.kind for e in events]
    assert kinds.count("worker_lost") == 1 and kinds.count("checkpoint") == 6
    (fetched,) = [e for e in events if e.kind == "checkpoint.fetched"]
    assert fetched.data["step"] >= in_storage and fetched.data["attempt"] == 1
    assert not (run_dir(settings, lost_id) / f"ckpt_{in_storage - 10:07d}.pt").exists()
    seqs = [(e.data["attempt"], e.data["seq"]) for e in events if e.kind.startswith("checkpoint.")]
    assert len(seqs) == len(set(seqs)), "each upload-log entry is one event"
    fs.invalidate_cache()
    names = sorted(n.rsplit("/", 1)[-1] for n in fs.ls(url.removeprefix("s3://"), detail=False))
    assert names == ["best.pt", "ckpt_0000060.pt", "metrics.jsonl", "records.jsonl", "samples"]



# -- copy-back from storage -------------------------------------------------------------------------------------


def test_sweep_copy_back_takes_checkpoints_from_storage(database_url: str, tmp_path: Path) -> None:
    """No node is reachable (the run's node is unknown to the sweep): the files come from storage."""
    store = tmp_path / "store" / "run-x"
    store.mkdir(parents=True)
    (store / "ckpt_0000020.pt").write_bytes(b"latest")
    (store / "best.pt").write_bytes(b"best")
    (store / "records.jsonl").write_text('{"step": 20}\n')
    (store / "ckpt_0000030.pt.partial").write_bytes(b"half an upload")
    with session_scope(database_url) as session:
        grid = create_grid(session, GridCreate(name="copy", arms=["A", "B"], overrides=TINY))
        stored, unstored = grid.runs
        stored.checkpoint_url, stored.node = f"file://{store}", "gone-node"
        unstored.checkpoint_url = f"file://{tmp_path / 'store' / 'never-written'}"
        ids, grid_id = (stored.id, unstored.id), grid.id
    results = tmp_path / "results" / "sweeps" / "1"
    results.mkdir(parents=True)
    problems, failed = copy_back(database_url, {}, 1, grid_id, [], results, 1 << 30)
    assert problems == [] and failed == set()
    got = results / "runs" / f"{ids[0]}-A"
    assert sorted(p.name for p in got.iterdir()) == ["best.pt", "ckpt_0000020.pt", "records.jsonl"]
    assert (got / "best.pt").read_bytes() == b"best"
    assert not (results / "runs" / f"{ids[1]}-B").exists()
    # The grid's report travels with the results (ablate report / report.html, self-contained).
    assert results_report(database_url, {}, grid_id, results) is None
    assert sorted(p.name for p in (results / "report").iterdir()) == ["report.html", "report.json", "report.md"]


def test_copy_back_takes_by_default_what_a_run_s_kept_checkpoints_need(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ABLATE_COPY_BACK_MAX_BYTES unset: each run's cap is the checkpoints it keeps at its model's size
    (keep_last, best.pt, one being replaced) plus room for samples, not 64 GiB; a larger file is refused."""
    from model.spec import ArmSpec, estimate_params
    from orchestrator.runs import storage
    from orchestrator.settings import Settings

    assert Settings(database_url=database_url).copy_back_max_bytes is None
    seed = storage.copy_back_bytes(ArmSpec().model_dump(mode="json"), keep_last=2)
    checkpoint = estimate_params(ArmSpec()) * 16  # fp32 weights, EMA and two optimizer moments
    assert 4 * checkpoint < seed < 20 << 30, seed
    monkeypatch.setattr(storage, "COPY_BACK_EXTRAS", 0)  # the tiny arm's cap: its checkpoints alone
    store = tmp_path / "store" / "run-big"
    store.mkdir(parents=True)
    with session_scope(database_url) as session:
        run = create_grid(session, GridCreate(name="capped", arms=["A"], overrides=TINY)).runs[0]
        run.checkpoint_url = f"file://{store}"
        cap, grid_id = storage.copy_back_bytes(run.spec, keep_last=2), run.grid_id
    (store / "best.pt").write_bytes(b"w" * (cap // 2))
    with (store / "huge.bin").open("wb") as f:
        f.truncate(cap + 1)  # sparse: a node's file past the run's cap
    results = tmp_path / "results" / "sweeps" / "2"
    results.mkdir(parents=True)
    problems, _ = copy_back(database_url, {}, 2, grid_id, [], results, None, keep_last=2)
    assert len(problems) == 1 and "huge.bin" in problems[0] and f"over {cap - cap // 2}" in problems[0], problems
    assert any((results / "runs").rglob("best.pt"))


# -- the dashboard's alarm ------------------------------------------------------------------------------------------


def test_dashboard_flags_a_run_whose_checkpoints_are_not_stored(database_url: str) -> None:
    now = datetime.now(UTC)
    with session_scope(database_url) as session:
        grid = create_grid(session, GridCreate(name="alarm", arms=["A"], overrides=TINY))
        run = grid.runs[0]
        run.checkpoint_url = "s3://bucket/run-alarm"
        session.flush()
        session.add(Event(run_id=run.id, grid_id=grid.id, kind="checkpoint.stored", message="", time=now - timedelta(
            minutes=40), data={"step": 10, "seq": 1, "attempt": 0}))
        session.add(Event(run_id=run.id, grid_id=grid.id, kind="checkpoint", message="step 10",
                          time=now - timedelta(minutes=41), data={"step": 10}))
        session.add(Event(run_id=run.id, grid_id=grid.id, kind="checkpoint", message="step 20",
                          time=now - timedelta(minutes=20), data={"step": 20}))
        session.add(Event(run_id=run.id, grid_id=grid.id, kind="checkpoint.store_failed", message="failed",
                          time=now - timedelta(minutes=1), data={"step": 20, "seq": 2, "attempt": 0,
                                                                 "error": "EndpointConnectionError: down"}))
        run_id, grid_id = run.id, grid.id
    with session_scope(database_url) as session:
        grid = session.get(Grid, grid_id)
        before = grid_version(session, grid_id, alarm_minutes=30)
        quiet = grid_detail(session, grid, alarm_minutes=30)["runs"][0]["storage"]
        assert quiet["alarm"] is False and quiet["stored_step"] == 10 and quiet["failed_attempts"] == 1
        loud = grid_detail(session, grid, alarm_minutes=15)["runs"][0]["storage"]
        assert loud["alarm"] is True and 19 <= loud["minutes_unstored"] <= 21
        assert loud["last_error"] == "EndpointConnectionError: down"
        assert grid_version(session, grid_id, alarm_minutes=15) != before, "the page redraws when the alarm starts"
    with session_scope(database_url) as session:
        run = session.get(Run, run_id)
        record_event(session, run, "checkpoint.stored", "step 20 stored", step=20, seq=3, attempt=0)
    with session_scope(database_url) as session:
        (status,) = storage_alarms(session, [session.get(Run, run_id)], minutes=15).values()
        assert status["alarm"] is False and status["stored_step"] == 20 and status["failed_attempts"] == 0


def test_a_node_raising_its_log_numbers_every_poll_stores_a_bounded_number_of_entries(database_url: str) -> None:
    """A node may send 64 new upload-log entries with every poll, each up to a few KB: per run, at most
    MAX_STORAGE_EVENTS become events (plus one note), and past them a newer checkpoint held in storage
    still counts for the alarm."""
    def flood(first: int) -> StorageStatus:
        entries = [{"seq": s, "kind": "checkpoint.store_failed", "message": "x" * 4000, "data": {"error": "y" * 4000}}
                   for s in range(first, first + 64)]
        return StorageStatus.model_validate({"log": entries})

    with session_scope(database_url) as session:
        run = create_grid(session, GridCreate(name="flood", arms=["A"], overrides=TINY)).runs[0]
        run.checkpoint_url = "memory://flood"
        session.flush()
        ingest(session, run, [{"step": 10}])
        seen = 0
        for _ in range(MAX_STORAGE_EVENTS // 64 + 8):
            seen = record_storage(session, run, 0, flood(seen + 1), seen)
        held = {"seq": seen + 1, "kind": "checkpoint.stored", "message": "", "data": {"step": 10}}
        record_storage(session, run, 0, StorageStatus.model_validate({"log": [held]}), seen)
        run_id = run.id
    events = events_of(database_url, run_id)
    assert sum(e.kind.startswith("checkpoint.") for e in events) == MAX_STORAGE_EVENTS + 1, len(events)
    assert [e.kind for e in events].count(LOG_CAPPED) == 1
    with session_scope(database_url) as session:
        (status,) = storage_alarms(session, [session.get_one(Run, run_id)], minutes=15).values()
    assert status["stored_step"] == 10


def test_upload_log_entries_become_events_once_across_polls_restarts_and_attempts(database_url: str) -> None:
    """The worker re-sends its last 50 log entries with every poll; each becomes one event, also after a
    controller restart (which reads back what it stored) and for a new attempt (whose sequence restarts)."""
    def log(*seqs: int) -> StorageStatus:
        return StorageStatus.model_validate({"log": [{"seq": s, "time": "t", "kind": "checkpoint.stored",
                                                      "message": f"#{s}", "data": {"step": 10 * s}} for s in seqs]})

    with session_scope(database_url) as session:
        run = create_grid(session, GridCreate(name="seq", arms=["A"], overrides=TINY)).runs[0]
        session.flush()
        seen = record_storage(session, run, 0, log(1, 2), 0)
        seen = record_storage(session, run, 0, log(1, 2, 3), seen)  # the next poll repeats 1 and 2
        run_id = run.id
    assert seen == 3
    with session_scope(database_url) as session:  # a restarted controller adopts the same worker
        run = session.get(Run, run_id)
        assert seen_seq(session, run_id, 0) == 3 and seen_seq(session, run_id, 1) == 0
        record_storage(session, run, 0, log(2, 3, 4), seen_seq(session, run_id, 0))
        record_storage(session, run, 1, log(1), seen_seq(session, run_id, 1))  # the next attempt's worker
    stored = [e for e in events_of(database_url, run_id) if e.kind == "checkpoint.stored"]
    kinds = [(e.data["attempt"], e.data["seq"]) for e in stored]
    assert kinds == [(0, 1), (0, 2), (0, 3), (0, 4), (1, 1)]
