"""The launcher on a real local Ray (4 logical GPUs, 2 CPUs) and a real database, training real tiny arms.

One Ray instance for the module (tests/kit/launcher.py); the launcher runs in a thread of the test process,
as in `ablate demo`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from orchestrator.db.models import Event, Run
from orchestrator.db.session import session_scope
from orchestrator.grids.service import GridCreate, create_grid, stop_run
from orchestrator.runs.launcher import Launcher
from orchestrator.runs.placement import run_dir
from tests.kit.launcher import RAY_NAMESPACE, launcher_settings_for
from tests.kit.polling import wait_for
from tests.kit.readers import all_ended, events_of, metrics_of, runs_of, steps_of
from tests.kit.settings import tiny_overrides
from worker.worker_names import worker_name

TINY = tiny_overrides(steps=40)


def submit(database_url: str, arms: list, overrides: dict | None = None) -> list[int]:
    with session_scope(database_url) as session:
        grid = create_grid(session, GridCreate(name="t", arms=arms, overrides=overrides or TINY))
        return [r.id for r in grid.runs]


def test_four_arms_on_four_gpus_a_fifth_waits_for_a_free_one(launcher: Launcher, database_url: str) -> None:
    arms = ["A", "B", "C", {"parent": "A", "name": "A2"}, {"parent": "A", "name": "A3"}]
    # The fifth arm is short so that it is the one still queued while the first four all run.
    ids = submit(database_url, arms)
    four, fifth = ids[:4], ids[4]

    def four_running() -> bool:
        rs = runs_of(database_url, ids)
        first = rs[:4]
        if all(r.state == "running" for r in first):
            assert rs[4].state == "queued", "the fifth arm must wait while four GPUs are taken"
            assert len({r.gpu_index for r in first}) == 4, [r.gpu_index for r in first]
            return True
        return False

    def streaming() -> bool:
        # Metrics reach the DB while their arm runs: some, not yet all four of its checkpoints.
        rs = runs_of(database_url, ids)
        return any(r.state == "running" and 0 < len(steps_of(database_url, r.id)) < 4 for r in rs)

    wait_for(four_running, "four arms running at once")
    wait_for(streaming, "a running arm's first checkpoints in the DB before it finishes", timeout=150)
    wait_for(lambda: all_ended(database_url, ids), "the grid to finish", timeout=150)
    rs = runs_of(database_url, ids)
    assert [r.state for r in rs] == ["completed"] * 5, [(r.state, r.error) for r in rs]
    assert sorted(r.gpu_index for r in rs[:4]) == ["0", "1", "2", "3"]
    # The fifth started only after one of the four finished, on the GPU that one freed.
    first_free = min(rs[:4], key=lambda r: r.finished_at)
    assert rs[4].gpu_index in {r.gpu_index for r in rs[:4] if r.finished_at <= rs[4].started_at}
    assert rs[4].started_at >= first_free.finished_at
    for run_id in [*four, fifth]:
        assert steps_of(database_url, run_id) == [10, 20, 30, 40]
        kinds = [e.kind for e in events_of(database_url, run_id)]
        assert kinds.count("checkpoint") == 4 and kinds.count("started") == 1 and kinds[-1] == "completed"


def test_an_arm_on_two_gpus_trains_data_parallel_beside_two_one_gpu_arms(
    launcher: Launcher, database_url: str
) -> None:
    ids = submit(database_url, [{"parent": "A", "name": "A-2gpu", "gpus": 2}, "B", "C"])

    def all_running() -> bool:
        return all(r.state == "running" for r in runs_of(database_url, ids))

    wait_for(all_running, "the 2-GPU arm and two 1-GPU arms on four GPUs at once", timeout=150)
    wait_for(lambda: all_ended(database_url, ids), "the grid to finish", timeout=200)
    two, b, c = runs_of(database_url, ids)
    assert [r.state for r in (two, b, c)] == ["completed"] * 3, [(r.state, r.error) for r in (two, b, c)]
    held = two.gpu_index.split(",")
    assert len(held) == 2 and not set(held) & {b.gpu_index, c.gpu_index}, (two.gpu_index, b.gpu_index, c.gpu_index)
    assert steps_of(database_url, two.id) == [10, 20, 30, 40]
    assert {m.extra["ranks"] for m in metrics_of(database_url, two.id)} == {2}


def test_an_auto_grids_run_starts_as_wide_as_the_launchers_redrawn_plan_says(
    launcher: Launcher, database_url: str
) -> None:
    """P names one GPU; Q is the plan's to size. With an hour each on four GPUs the plan from now puts Q
    on two beside P (both end by 1 h, Q sooner). Q is queued at one GPU: the launcher's redraw widens it.
    Growing a running arm is off here (a restart dearer than any night): P ends long before its hour, and Q
    would grow onto the GPUs it frees if still running (tests/orchestrator/runs/test_grow_launcher.py)."""
    launcher.grower.settings = launcher.settings.model_copy(update={"grow_resume_s": 1e9})
    with session_scope(database_url) as session:
        arms = [{"parent": "A", "name": "P", "gpus": 1}, {"parent": "A", "name": "Q"}]
        grid = create_grid(session, GridCreate(name="auto", arms=arms, overrides=TINY, gpus_per_arm="auto"),
                           nodes={"local": 4})
        # The scaling given, as the hours are: logical GPUs on a CPU do not scale, and the earlier tests' 2-GPU
        # arm and its 1-GPU twin leave a measured scaling that depends on the machine's load (below 1x once).
        grid.plan = {**grid.plan, "hours": {"P": 1.0, "Q": 1.0}, "scaling": {"2": 2.0, "4": 4.0}}
        p, q = grid.runs
        q.spec = {**q.spec, "gpus": 1}
        ids = [p.id, q.id]
    wait_for(lambda: all_ended(database_url, ids), "the auto grid to finish", timeout=200)
    p_run, q_run = runs_of(database_url, ids)
    assert [r.state for r in (p_run, q_run)] == ["completed"] * 2, [(r.state, r.error) for r in (p_run, q_run)]
    assert (p_run.spec["gpus"], q_run.spec["gpus"]) == (1, 2)
    assert {m.extra["ranks"] for m in metrics_of(database_url, q_run.id)} == {2}
    assert len(q_run.gpu_index.split(",")) == 2


def test_kill_9_of_a_worker_resumes_from_its_checkpoint(launcher: Launcher, database_url: str) -> None:
    overrides = {**TINY, "schedule": {**TINY["schedule"], "steps": 80}}
    (run_id,) = submit(database_url, ["A"], overrides)
    wait_for(lambda: len(steps_of(database_url, run_id)) >= 2, "two checkpoints")
    worker = ray.get_actor(worker_name(run_id, 0), namespace=RAY_NAMESPACE)
    pid = ray.get(worker.ping.remote())["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: all_ended(database_url, [run_id]), "the resumed run to finish", timeout=150)
    (run,) = runs_of(database_url, [run_id])
    assert run.state == "completed" and run.retries == 1, (run.state, run.error)
    assert steps_of(database_url, run_id) == list(range(10, 81, 10))  # no gap, no duplicate
    kinds = [e.kind for e in events_of(database_url, run_id)]
    assert kinds.count("worker_lost") == 1 and kinds.count("resumed") == 1 and kinds.count("started") == 2
    assert kinds.count("checkpoint") == 8
    resumed = next(e for e in events_of(database_url, run_id) if e.kind == "resumed")
    assert resumed.data["step"] >= 20


def test_user_stop_is_graceful_with_a_final_checkpoint(launcher: Launcher, database_url: str) -> None:
    overrides = {**TINY, "schedule": {**TINY["schedule"], "steps": 400}}
    (run_id,) = submit(database_url, ["A"], overrides)
    wait_for(lambda: steps_of(database_url, run_id), "a first checkpoint")
    with session_scope(database_url) as session:
        stop_run(session, session.get(Run, run_id))
    wait_for(lambda: all_ended(database_url, [run_id]), "the stop")
    (run,) = runs_of(database_url, [run_id])
    metrics = metrics_of(database_url, run_id)
    assert run.state == "stopped" and metrics[-1].step < 400
    # The last record is the final checkpoint (a fresh one, or the one just written when the stop
    # arrived during its evaluation), and it is on disk.
    assert run.last_checkpoint_step == metrics[-1].step and Path(metrics[-1].extra["checkpoint"]).exists()
    assert [e.kind for e in events_of(database_url, run_id)][-1] == "stopped"


def test_an_exploding_lr_is_stopped_with_its_best_checkpoint_kept(launcher: Launcher, database_url: str) -> None:
    overrides = {
        **TINY,
        "schedule": {**TINY["schedule"], "steps": 200, "lr": 1e-3, "lr_explode_after": 30, "lr_explode_factor": 1e4},
    }
    (run_id,) = submit(database_url, ["A"], overrides)
    wait_for(lambda: all_ended(database_url, [run_id]), "the detector to stop the run", timeout=150)
    (run,) = runs_of(database_url, [run_id])
    assert run.state == "stopped" and run.decision in {"collapse", "diverged"}, (run.state, run.decision, run.error)
    assert run.decision_step is not None and run.decision_step < 200 and run.decision_reason
    assert run.best_step is not None and run.best_step <= run.decision_step
    assert run.best_checkpoint and Path(run.best_checkpoint).exists()
    decision = next(e for e in events_of(database_url, run_id) if e.kind == "decision")
    assert decision.data["best_step"] == run.best_step


def test_a_new_run_moves_a_stale_directory_aside_instead_of_resuming_it(
    launcher: Launcher, database_url: str
) -> None:
    """Files under a brand-new run's directory (left by a deleted database whose run had the same id)
    are moved aside with a `stale_dir` event: the run starts from step 0, not from their records."""
    overrides = {**TINY, "schedule": {**TINY["schedule"], "steps": 20}}
    fake = {"step": 30, "recon_lpips": 0.123, "loss": 0.5}
    # The stale files exist before the run is committed, so the launcher cannot launch it first.
    with session_scope(database_url) as session:
        run_id = create_grid(session, GridCreate(name="stale", arms=["A"], overrides=overrides)).runs[0].id
        stale = run_dir(launcher.settings, run_id)
        stale.mkdir(parents=True)
        (stale / "ckpt_0000030.pt").write_bytes(b"someone else's checkpoint")
        (stale / "records.jsonl").write_text(json.dumps(fake) + "\n")  # a worker would hand this on
    wait_for(lambda: all_ended(database_url, [run_id]), "the run to finish", timeout=150)
    (run,) = runs_of(database_url, [run_id])
    assert run.state == "completed" and run.retries == 0, (run.state, run.error)
    # Trained from scratch: its own checkpoints only, none of the stale record.
    assert steps_of(database_url, run_id) == [10, 20]
    assert all(m.recon_lpips != fake["recon_lpips"] for m in metrics_of(database_url, run_id))
    events = events_of(database_url, run_id)
    assert "resumed" not in [e.kind for e in events]
    (moved,) = [e for e in events if e.kind == "stale_dir"]
    aside = Path(moved.data["path"])
    assert aside.parent == stale.parent and aside.name.startswith(f"{run_id}.stale-")
    assert (aside / "ckpt_0000030.pt").read_bytes() == b"someone else's checkpoint"
    assert json.loads((aside / "records.jsonl").read_text()) == fake
    assert not (stale / "ckpt_0000030.pt").exists() and run.checkpoint_dir == str(stale)


def test_a_worker_ray_cannot_place_times_out_as_a_retry_then_fails(
    ray_cluster: str, database_url: str, tmp_path: Path
) -> None:
    @ray.remote(num_gpus=4, num_cpus=0)
    class GpuHog:  # all four GPUs taken by something that is not ours: our workers stay pending
        def ping(self) -> int:
            return 1

    hog = GpuHog.remote()
    ray.get(hog.ping.remote())
    s = Launcher(launcher_settings_for(database_url, tmp_path, ray_cluster, start_timeout_s=1.0, max_retries=1))
    try:
        (run_id,) = submit(database_url, ["A"])
        s.start()
        wait_for(lambda: all_ended(database_url, [run_id]), "the start timeouts to fail the run", timeout=60)
    finally:
        s.stop()
        ray.kill(hog)
    (run,) = runs_of(database_url, [run_id])
    assert (run.state, run.retries) == ("failed", 2), (run.state, run.retries, run.error)
    assert "start_timeout_s" in run.error
    kinds = [e.kind for e in events_of(database_url, run_id)]
    assert kinds.count("worker_lost") == 1 and "started" not in kinds and kinds[-1] == "failed"
    assert s.workers == {}, "the pending actors were killed, not left waiting for a GPU"


def test_reconcile_counts_a_retry_for_a_vanished_worker_and_a_stopped_run_never_relaunches(
    ray_cluster: str, database_url: str, tmp_path: Path
) -> None:
    vanished, collapsed = submit(database_url, ["A", "B"])
    with session_scope(database_url) as session:
        lost = session.get(Run, vanished)
        lost.state, lost.retries = "running", 1  # its worker (attempt 1) does not exist
        stopped = session.get(Run, collapsed)
        stopped.decision, stopped.decision_reason = "collapse", "worse twice"  # queued, detector said stop
    s = Launcher(launcher_settings_for(database_url, tmp_path, ray_cluster, max_retries=1))
    s.reconcile()
    (lost,) = runs_of(database_url, [vanished])
    assert (lost.state, lost.retries) == ("failed", 2), "a restart must not reset the retry budget"
    s._launch_queued()
    (stopped,) = runs_of(database_url, [collapsed])
    assert stopped.state == "stopped" and stopped.finished_at is not None
    assert s.workers == {}, "no worker for a stopped run"
    with pytest.raises(ValueError):
        ray.get_actor(worker_name(collapsed, 0), namespace=RAY_NAMESPACE)


def _fail_commits_once_with(predicate: Callable[[Any], bool], error: Exception) -> tuple[Callable, list[int]]:
    """A before_commit hook (fault injection) that raises `error` for the first session whose new
    objects satisfy `predicate`; returns (hook, a list that records each injected failure)."""
    fired: list[int] = []

    def hook(session: Any) -> None:
        if not fired and any(predicate(obj) for obj in session.new):
            fired.append(1)
            raise error

    return hook, fired


def test_a_failed_db_write_after_a_worker_death_does_not_strand_the_run(
    launcher: Launcher, database_url: str
) -> None:
    from sqlalchemy import event
    from sqlalchemy.exc import OperationalError
    from sqlalchemy.orm import Session

    overrides = {**TINY, "schedule": {**TINY["schedule"], "steps": 60}}
    (run_id,) = submit(database_url, ["A"], overrides)
    wait_for(lambda: len(steps_of(database_url, run_id)) >= 2, "two checkpoints")
    # The write that re-queues the run fails once (the database restarting): the worker is already
    # untracked, so only a reconcile on a later pass can find the run again.
    hook, fired = _fail_commits_once_with(
        lambda o: isinstance(o, Event) and o.kind == "worker_lost",
        OperationalError("UPDATE runs ...", {}, Exception("injected: server closed the connection")),
    )
    event.listen(Session, "before_commit", hook)
    try:
        worker = ray.get_actor(worker_name(run_id, 0), namespace=RAY_NAMESPACE)
        os.kill(ray.get(worker.ping.remote())["pid"], signal.SIGKILL)
        wait_for(lambda: all_ended(database_url, [run_id]), "the stranded run to be found and finished", timeout=150)
    finally:
        event.remove(Session, "before_commit", hook)
    assert fired == [1], "the fault was injected"
    (run,) = runs_of(database_url, [run_id])
    assert run.state == "completed" and run.retries == 1, (run.state, run.error)
    assert steps_of(database_url, run_id) == list(range(10, 61, 10))


def test_records_that_cannot_be_stored_fail_their_run_and_stall_nothing(
    launcher: Launcher, database_url: str
) -> None:
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    poisoned, healthy = submit(database_url, ["A", {"parent": "A", "name": "A2"}])

    def refuse(session: Any, *_: Any) -> None:  # every store of the poisoned run's checkpoints fails (not a DB outage)
        if any(isinstance(o, Event) and o.run_id == poisoned and o.kind == "checkpoint" for o in session.new):
            raise ValueError("injected: a record the database refuses")

    event.listen(Session, "before_flush", refuse)
    try:
        wait_for(lambda: all_ended(database_url, [poisoned, healthy]), "both runs to end", timeout=150)
    finally:
        event.remove(Session, "before_flush", refuse)
    bad, good = runs_of(database_url, [poisoned, healthy])
    assert good.state == "completed" and steps_of(database_url, healthy) == [10, 20, 30, 40]
    assert bad.state == "failed" and "could not be stored 5 times" in bad.error and "injected" in bad.error
    assert poisoned not in launcher.workers


@pytest.fixture
def unwritable_runs_dir(tmp_path: Path) -> Iterator[Path]:
    """tmp_path/runs, where no worker can create a run's directory: immutable for root (whom permission
    bits do not stop), mode 0500 for anyone else."""
    runs = tmp_path / "runs"
    runs.mkdir()
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(runs)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not supported on this filesystem")
    else:
        runs.chmod(0o500)
    yield runs
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(runs)], check=True)
    else:
        runs.chmod(0o700)


def test_a_worker_that_cannot_write_its_directory_fails_its_run_at_once(
    launcher: Launcher, database_url: str, unwritable_runs_dir: Path, ablate_cli  # type: ignore[no-untyped-def]
) -> None:
    """The real Ray actor's constructor meets a PermissionError: the run fails at once (no retry, no
    "worker lost") with the exception's type, message, path and innermost frame, free of terminal codes,
    and `ablate status` shows it."""
    [run_id] = submit(database_url, ["A"])
    wait_for(lambda: all_ended(database_url, [run_id]), "the run to end", timeout=120)
    [run] = runs_of(database_url, [run_id])
    expected_path = str(unwritable_runs_dir / str(run_id))
    assert run.state == "failed" and run.retries == 0, (run.state, run.retries, run.error)
    first = run.error.splitlines()[0]
    assert first.startswith("PermissionError: ") and expected_path in first, first
    assert "(at worker/actor.py:" in first and "in __init__)" in first, first
    assert "\x1b" not in run.error
    kinds = [e.kind for e in events_of(database_url, run_id)]
    assert "worker_lost" not in kinds and "started" not in kinds and kinds[-1] == "failed", kinds
    with session_scope(database_url) as session:
        grid_id = session.get(Run, run_id).grid_id
    status = ablate_cli(database_url, "status", str(grid_id))
    assert status.returncode == 0, status.stderr
    assert "PermissionError" in status.stdout and expected_path in status.stdout, status.stdout
