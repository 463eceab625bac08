"""Command arms on a real local Ray with the real launcher and database: the researcher's process is run,
stopped through its stop file (or SIGTERM, then SIGKILL), resumed from storage, and its failure shown."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

import ray

from orchestrator.db.models import Run
from orchestrator.db.session import session_scope
from orchestrator.grids.service import GridCreate, PathPolicy, create_grid, stop_run
from orchestrator.runs.launcher import Launcher
from orchestrator.runs.placement import run_dir
from orchestrator.settings import Settings
from tests.kit.launcher import RAY_NAMESPACE
from tests.kit.polling import wait_for
from tests.kit.readers import all_ended, events_of, metrics_of, run_of
from tests.kit.settings import tiny_overrides
from worker.worker_names import worker_name

HERE = Path(__file__).resolve().parent
STAND_IN = HERE / "command_trainer"  # a stdlib trainer with a flag per behaviour
EXAMPLE = HERE.parents[2] / "examples" / "your-trainer"  # the PyTorch example a researcher copies
ALLOWED = PathPolicy(allow_commands=True, command_dirs=[HERE, EXAMPLE])


def stand_in(name: str, *args: str, **over: object) -> dict:
    return {"name": name, "code": str(STAND_IN), "command": [sys.executable, "train.py", *args],
            "detector": {"metric": "val_loss"}, **over}


def submit(database_url: str, arms: list, overrides: dict | None = None) -> list[int]:
    with session_scope(database_url) as session:
        grid = create_grid(session, GridCreate(name="t", arms=arms, overrides=overrides or {}), paths=ALLOWED)
        return [r.id for r in grid.runs]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_a_diverging_command_arm_is_stopped_through_its_stop_file_beside_arm_a(
    launcher: Launcher, launcher_settings: Settings, database_url: str
) -> None:
    example = {"code": str(EXAMPLE), "detector": {"metric": "val_loss"}, "stop_grace_s": 60}
    healthy = {**example, "name": "mine", "command": [sys.executable, "train.py", "--steps", "300"]}
    # Its steps never run out: only the detector's stop can end it.
    broken = {**example, "name": "mine-broken",
              "command": [sys.executable, "train.py", "--steps", "10000000", "--diverge-at", "100"]}
    ids = submit(database_url, ["A", healthy, broken], tiny_overrides(steps=40))
    wait_for(lambda: all_ended(database_url, ids), "the grid to finish", timeout=240)
    a, good, bad = (run_of(database_url, i) for i in ids)
    assert (a.state, good.state) == ("completed", "completed"), (a.error, good.error)
    assert [m.step for m in metrics_of(database_url, good.id)][-1] == 300
    assert bad.state == "stopped" and bad.decision in {"collapse", "diverged"}, (bad.state, bad.error)
    final = events_of(database_url, bad.id)[-1]
    assert final.kind == "stopped" and final.data["ended_by"] == "stop_file", final.message  # within the grace
    # Its best checkpoint, by the metric the grid named, is kept: best.pt is the script's own file of that step.
    assert 100 <= bad.decision_step and bad.best_step is not None and bad.best_step < bad.decision_step
    out = run_dir(launcher_settings, bad.id)
    assert bad.best_checkpoint == str(out / "best.pt")
    best_line = next(m for m in metrics_of(database_url, bad.id) if m.step == bad.best_step)
    assert Path(bad.best_checkpoint).samefile(out / "run" / best_line.extra["checkpoint_file"])


def test_a_command_arm_on_two_gpus_sees_both_in_cuda_visible_devices(
    launcher: Launcher, launcher_settings: Settings, database_url: str
) -> None:
    (run_id,) = submit(database_url, [stand_in("pair", "--steps", "20", gpus=2)])
    wait_for(lambda: all_ended(database_url, [run_id]), "the arm to finish", timeout=120)
    run = run_of(database_url, run_id)
    assert run.state == "completed", run.error
    held = run.gpu_index.split(",")
    assert len(held) == 2 and len(set(held)) == 2, run.gpu_index
    stderr = (run_dir(launcher_settings, run_id) / "stderr.log").read_text()
    assert f"gpus={run.gpu_index}" in stderr  # the command's own environment: both GPUs, as Ray pinned them


def test_a_command_that_ignores_its_stop_file_gets_sigterm_then_sigkill(
    launcher: Launcher, launcher_settings: Settings, database_url: str
) -> None:
    arm = stand_in("stubborn", "--steps", "10000000", "--ignore-stop", stop_grace_s=0.5, term_grace_s=1.0)
    (run_id,) = submit(database_url, [arm])
    wait_for(lambda: metrics_of(database_url, run_id), "a first metrics line")
    with session_scope(database_url) as session:
        stop_run(session, session.get_one(Run, run_id))
    wait_for(lambda: all_ended(database_url, [run_id]), "the stop")
    run = run_of(database_url, run_id)
    final = events_of(database_url, run_id)[-1]
    assert run.state == "stopped" and final.data["ended_by"] == "sigkill", (run.state, final.message)
    assert "SIGKILL" in final.message
    out = run_dir(launcher_settings, run_id)
    assert "SIGTERM received" in (out / "stderr.log").read_text()  # SIGTERM came first, and was ignored
    assert not alive(int((out / "run" / "pid").read_text()))


def test_a_command_arm_whose_worker_is_killed_resumes_from_its_stored_checkpoints(
    launcher: Launcher, launcher_settings: Settings, database_url: str, tmp_path: Path
) -> None:
    (run_id,) = submit(database_url, [stand_in("mine", "--steps", "80", "--step-s", "0.05")])

    def stored() -> int:
        return max([e.data["step"] for e in events_of(database_url, run_id) if e.kind == "checkpoint.stored"] or [0])

    wait_for(lambda: stored() >= 20, "two checkpoints in storage")
    worker = ray.get_actor(worker_name(run_id, 0), namespace=RAY_NAMESPACE)
    pid = ray.get(worker.ping.remote())["pid"]
    out = run_dir(launcher_settings, run_id)
    trainer = int((out / "run" / "pid").read_text())
    # A lost node: the worker frozen, its disk taken away, then killed; only storage has the checkpoints.
    os.kill(pid, signal.SIGSTOP)
    shutil.move(out, tmp_path / "lost-disk")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(trainer), "the killed worker's trainer to end with it")
    wait_for(lambda: all_ended(database_url, [run_id]), "the resumed run to finish", timeout=150)
    run = run_of(database_url, run_id)
    assert (run.state, run.retries) == ("completed", 1), run.error
    metrics = metrics_of(database_url, run_id)
    assert [m.step for m in metrics] == list(range(10, 81, 10)), "contiguous, none twice"
    resumed = [m.extra["resumed_from"] for m in metrics if m.extra["resumed_from"]]
    assert resumed and resumed[0] >= 20 and len(set(resumed)) == 1, "restarted once, from a stored checkpoint"
    assert f"start={resumed[0]} resumed=1" in (out / "stderr.log").read_text()
    assert (out / "run" / "checkpoints" / f"step_{resumed[0]:04d}.txt").exists()


def test_a_crashing_command_arm_shows_its_stderr_tail_on_the_run(
    launcher: Launcher, database_url: str
) -> None:
    (run_id,) = submit(database_url, [stand_in("crash", "--crash-at", "15")])
    wait_for(lambda: all_ended(database_url, [run_id]), "the crash")
    run = run_of(database_url, run_id)
    assert run.state == "failed" and run.error is not None
    assert run.error.startswith("command exited with code 3")
    assert run.error.splitlines()[-1] == "trace line 59" and "trace line 10\n" in run.error
    assert "trace line 9\n" not in run.error, "only the last 50 lines"
    assert "\x1b" not in run.error
    assert [m.step for m in metrics_of(database_url, run_id)] == [10]  # what it reported before is kept
