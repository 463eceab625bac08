"""A deciding grid on a real local Ray and a real database, with the controller killed (SIGKILL) mid-decision
and started again: A against A with its lr x30 takes more work (images or seeds, whichever the chooser
prices better) only while the comparison is open, decides it, and the restart loses no look and repeats
none.

Each run is scored on the whole split (64 images) inside its training job (runs/in_training.py), so the first
look judges the comparison on 64 images and queues no evaluation: open (killed here), then seeds, each new one
scored on the 64 images in its own training job, until it is better; the test holds whatever mix of actions
the chooser takes.

The controller is `python -m orchestrator.loop` (the launcher with its listeners: the decision pass
among them) in a subprocess joined to this module's Ray; its workers are named, detached actors, which the
restarted one adopts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from sqlalchemy import select

from orchestrator.db.models import DecisionLook, Evaluation, Event, Grid
from orchestrator.db.session import session_scope
from orchestrator.grids.evaluations import ran_in_training
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.results.deciding.decisions import look_comparisons
from tests.kit.polling import wait_for
from tests.kit.settings import tiny_overrides

NAMESPACE = "ablate-decide-test"
TINY = tiny_overrides(20)
# The training records evaluate 8 of 64 held-out images: on 8, which images were drawn is most of the
# interval (measured: 4 images left x30's effect of -0.76 inside +-2.2), so the first look stays open.
TINY["eval"]["num_samples"], TINY["data"]["held_out"] = 8, 64
LR30 = {"parent": "A", "name": "A-lr30", "schedule": {"lr": 9e-3}}  # A's lr 3e-4 x 30


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    ray.init(num_gpus=4, num_cpus=2, namespace=NAMESPACE, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def start_loop(database_url: str, ray_address: str, storage: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "ABLATE_DATABASE_URL": database_url, "ABLATE_RAY_ADDRESS": ray_address,
           "ABLATE_RAY_NAMESPACE": NAMESPACE, "ABLATE_HOME_DIR": str(storage), "ABLATE_LAUNCHER_INTERVAL_S": "0.2",
           "ABLATE_WORKER_THREADS": "1"}  # fmt: skip
    with log.open("ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "orchestrator.loop"], env=env, stdout=fh, stderr=fh)


def looks(database_url: str, grid_id: int) -> list[DecisionLook]:
    with session_scope(database_url) as session:
        found = list(session.scalars(select(DecisionLook).where(DecisionLook.grid_id == grid_id)
                                     .order_by(DecisionLook.wave)))  # fmt: skip
        session.expunge_all()
        return found


def report_written(database_url: str, grid_id: int) -> bool:
    with session_scope(database_url) as session:
        found = select(Event.id).where(Event.grid_id == grid_id, Event.kind == "report.written")
        return session.scalar(found) is not None


def test_a_deciding_grid_adds_seeds_while_open_decides_and_survives_a_restart(
    ray_address: str, database_url: str, tmp_path: Path
) -> None:
    decide = {"alpha": 0.05, "min_seeds": 2, "max_seeds": 4, "margin": {"val_flow_ivw": 0.0}}
    with session_scope(database_url) as session:
        grid_id = create_grid(session, GridCreate(name="decides", arms=["A", LR30], overrides=TINY, decide=decide)).id
    log = tmp_path / "controller.log"
    first = start_loop(database_url, ray_address, tmp_path, log)
    try:
        wait_for(lambda: len(looks(database_url, grid_id)) >= 1, "the first look", 400, 0.2, log, proc=first)
        # Killed mid-decision: its look stored, the seeds it queued not yet run.
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    (look1,) = looks(database_url, grid_id)
    (c1,) = look_comparisons(look1)
    assert (c1.arm, c1.other_arm, c1.k, c1.n, c1.decision, look1.final) == ("A-lr30", "A", 2, 64, "open", False)
    second = start_loop(database_url, ray_address, tmp_path, log)
    try:
        wait_for(lambda: report_written(database_url, grid_id), "the final look, then the report", 600, 0.5, log,
                 proc=second)  # fmt: skip
    finally:
        second.send_signal(signal.SIGINT)
        try:
            second.wait(timeout=30)
        except subprocess.TimeoutExpired:
            second.kill()
    taken = looks(database_url, grid_id)
    # One look per wave, none lost (waves 0..m) and none repeated (unique per grid and wave).
    assert [look.wave for look in taken] == list(range(len(taken))) and len(taken) >= 2 and taken[-1].final
    assert not any(look.final for look in taken[:-1]) and taken[-1].actions == []
    comparisons = [look_comparisons(look)[0] for look in taken]
    # Work was added only while the comparison was open, one action per look; the last look decided it.
    assert [c.decision for c in comparisons[:-1]] == ["open"] * (len(taken) - 1)
    actions = [look.actions for look in taken[:-1]]
    assert all(len(a) == 1 and a[0]["action"] in ("seed", "images") for a in actions), actions
    assert all(a[0]["arms"] == ["A", "A-lr30"] for a in actions if a[0]["action"] == "seed")
    last = comparisons[-1]
    assert last.decision == "better" and last.diff < 0 and last.high is not None and last.high < 0, last
    seeds_added = sum(a[0]["action"] == "seed" for a in actions)
    assert last.k == 2 + seeds_added <= 4 and 0 < last.alpha_spent <= 0.05
    with session_scope(database_url) as session:
        grid = session.get(Grid, grid_id)
        assert grid is not None
        pairs = sorted((r.arm, r.seed) for r in grid.runs)
        assert pairs == sorted((arm, s) for arm in ("A", "A-lr30") for s in range(last.k))  # no seed twice
        assert all(r.state == "completed" for r in grid.runs), [(r.arm, r.seed, r.state, r.error) for r in grid.runs]
        found = session.scalars(select(Evaluation).where(Evaluation.grid_id == grid_id).order_by(Evaluation.id))
        evaluations = [(e.images, e.state, bool(e.results) and all(map(ran_in_training, e.results))) for e in found]
        events = [(e.kind, e.data) for e in session.scalars(select(Event).where(Event.grid_id == grid_id)
                                                             .order_by(Event.id))]  # fmt: skip
    kinds = [kind for kind, _ in events]
    # The runs' training jobs scored every run on the split (one in-training evaluation, no job started for it);
    # every other evaluation is an images action, or the catch-up that scores a run not scored in training.
    assert [(n, state) for n, state, trained in evaluations if trained] == [(64, "completed")], evaluations
    queued = [(d["images"], "completed") for kind, d in events
              if kind == "decide.catch_up" or kind == "decide.action" and d["action"] == "images"]  # fmt: skip
    assert [(n, state) for n, state, trained in evaluations if not trained] == queued
    assert kinds.count("decide.look") == len(taken) and kinds.count("decide.action") == len(taken) - 1
    assert kinds.count("report.written") == 1  # once, after the decision ended
