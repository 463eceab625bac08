"""Orchestration overheads of the launcher on a local Ray with logical GPUs and a real database.

    python bench/orchestration.py [--database-url postgresql+psycopg://postgres@127.0.0.1:55432/postgres]
                                  [--gpus 4] [--ingest-arms 32] [--ingest-records 200] [--latency-runs 5]

Three measurements, each through the real Launcher, Ray actors (worker/actor.py) and the DB:

1. submission -> first step: one arm submitted to an idle controller. Timestamps: the run's row
   (submission), its `started` event (worker up on its GPU), its first metric row. With the synthetic
   stream the first record is the first "step"; with the real trainer (tiny arm, checkpoint every
   step) the first step ends at record time minus its evaluation time (eval_time_s).
2. idle gap: more arms than GPUs, each a synthetic 2 s stream; per GPU, the time between one run's
   `completed` event and the next run's `started` event on that GPU.
3. ingest rate: many concurrent arms each streaming records as fast as the worker can produce them;
   records stored per second, first row to last row, with the detector judging every checkpoint.

On Postgres a throwaway database is created on the server and dropped afterwards.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
SYNTHETIC = "orchestration:synthetic_train"  # importable by the workers: BENCH_DIR is on their PYTHONPATH
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR.parent))  # the test kit: tests.kit

from tests.kit.settings import tiny_overrides  # noqa: E402


def synthetic_train(
    spec: Any, out_dir: Path, device: str = "cpu", should_stop: Any = None, lpips_weights: Any = None,
    **_: Any,  # train_arm's optional keywords (data_store, compile_cache): nothing to use them for
) -> Iterator[dict[str, Any]]:
    """A stand-in for worker.train.train_arm with the same record shape and no training.

    spec.schedule.steps / checkpoint_every records, ABLATE_BENCH_RECORD_DELAY_S seconds apart (0 = as
    fast as possible); the LPIPS curve falls slowly so the detector says continue.
    """
    delay = float(os.environ.get("ABLATE_BENCH_RECORD_DELAY_S", "0"))
    every, total = spec.schedule.checkpoint_every, spec.schedule.steps
    t0 = time.perf_counter()
    for step in range(every, total + 1, every):
        if delay:
            time.sleep(delay)
        stop = bool(should_stop and should_stop())
        yield {
            "step": step,
            "train_loss": 1.0 / (1 + step),
            "grad_norm": 0.5,
            "lr": 3e-4,
            "recon_lpips": 0.9 - 0.1 * step / total,
            "recon_lpips_se": 0.005,
            "recon_lpips_n": 25,
            "text_lpips": 0.9 - 0.05 * step / total,
            "text_lpips_se": 0.005,
            "text_lpips_n": 25,
            "iter_per_sec": 10.0,
            "wall_time_s": time.perf_counter() - t0,
            "lpips_backbone": "synthetic",
            "checkpoint": str(Path(out_dir) / f"ckpt_{step:07d}.pt"),
            "fallbacks": [],
            "final": stop or step == total,
        }
        if stop:
            return


def _fresh_database(url: str) -> tuple[str, Any]:
    """(URL of an empty migrated database, cleanup callable)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from orchestrator.db.session import upgrade

    if url.startswith("sqlite"):
        path = Path(tempfile.mkdtemp()) / "bench.db"
        db = f"sqlite:///{path}"
        upgrade(db)
        return db, lambda: None
    name = f"ablate_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(make_url(url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    db = make_url(url).set(database=name).render_as_string(hide_password=False)
    upgrade(db)

    def drop() -> None:
        from orchestrator.db.session import engine_for

        engine_for(db).dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    return db, drop


def _submit(db: str, arms: list[Any], overrides: dict[str, Any]) -> list[int]:
    from orchestrator.db.session import session_scope
    from orchestrator.grids.service import GridCreate, create_grid

    with session_scope(db) as session:
        grid = create_grid(session, GridCreate(name=f"bench {time.time():.0f}", arms=arms, overrides=overrides))
        return [r.id for r in grid.runs]


def _wait_done(db: str, ids: list[int], timeout: float = 600) -> None:
    from sqlalchemy import select

    from orchestrator.db.models import Run
    from orchestrator.db.session import session_scope
    from orchestrator.vocabulary import TERMINAL_STATES

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with session_scope(db) as session:
            states = session.scalars(select(Run.state).where(Run.id.in_(ids))).all()
        if all(s in TERMINAL_STATES for s in states):
            bad = [s for s in states if s != "completed"]
            if bad:
                raise SystemExit(f"bench runs ended {bad}")
            return
        time.sleep(0.05)
    raise SystemExit(f"bench runs {ids} did not finish in {timeout} s")


def _event_times(db: str, ids: list[int], kind: str) -> dict[int, datetime]:
    from sqlalchemy import select

    from orchestrator.db.models import Event
    from orchestrator.db.session import session_scope

    with session_scope(db) as session:
        rows = session.execute(select(Event.run_id, Event.time).where(Event.run_id.in_(ids), Event.kind == kind))
        return {run_id: t for run_id, t in rows}


def latency(db: str, launcher_cls: Any, settings: Any, n: int) -> dict[str, list[float]]:
    """Seconds from submission to worker up, to first record (synthetic), and to the real first step."""
    from sqlalchemy import select

    from orchestrator.db.models import Metric, Run
    from orchestrator.db.session import session_scope

    out: dict[str, list[float]] = {"started": [], "first_record": [], "real_started": [], "real_first_step": []}
    for train_fn, arms_n in ((SYNTHETIC, n), (None, 2)):
        launcher = launcher_cls(settings, train_fn=train_fn or "worker.train:train_arm")
        launcher.start()
        try:
            for _ in range(arms_n):
                (run_id,) = _submit(db, ["A"], tiny_overrides(2, 1, warmup_steps=1))
                _wait_done(db, [run_id])
                with session_scope(db) as session:
                    run = session.get(Run, run_id)
                    first = session.scalars(select(Metric).where(Metric.run_id == run_id).order_by(Metric.step)).first()
                    started = _event_times(db, [run_id], "started")[run_id]
                    if train_fn:
                        out["started"].append((started - run.created_at).total_seconds())
                        out["first_record"].append((first.created_at - run.created_at).total_seconds())
                    else:
                        out["real_started"].append((started - run.created_at).total_seconds())
                        eval_s = float(first.extra.get("eval_time_s") or 0.0)
                        out["real_first_step"].append((first.created_at - run.created_at).total_seconds() - eval_s)
        finally:
            launcher.stop()
    return out


def idle_gaps(db: str, launcher_cls: Any, settings: Any, gpus: int, per_gpu: int) -> tuple[list[float], list[float]]:
    """Per GPU, in seconds: (next run launched - previous run's `completed`: the launcher's reaction,
    next run's `started` (worker up) - previous `completed`: the GPU's idle gap)."""
    from sqlalchemy import select

    from orchestrator.db.models import Run
    from orchestrator.db.session import session_scope

    arms = [{"parent": "A", "name": f"g{i}"} for i in range(gpus * per_gpu)]
    launcher = launcher_cls(settings, train_fn=SYNTHETIC)
    launcher.start()
    try:
        ids = _submit(db, arms, tiny_overrides(4, 1, warmup_steps=1))
        _wait_done(db, ids)
    finally:
        launcher.stop()
    started, completed = _event_times(db, ids, "started"), _event_times(db, ids, "completed")
    with session_scope(db) as session:
        gpu_of = dict(session.execute(select(Run.id, Run.gpu_index).where(Run.id.in_(ids))).all())
        launched = dict(session.execute(select(Run.id, Run.started_at).where(Run.id.in_(ids))).all())
    reaction, gaps = [], []
    for gpu in set(gpu_of.values()):
        mine = sorted((r for r in ids if gpu_of[r] == gpu), key=lambda r: started[r])
        for a, b in zip(mine, mine[1:], strict=False):
            # The next run on this GPU was launched by the completion that freed it (or earlier, queued in Ray).
            reaction.append(max(0.0, (launched[b] - completed[a]).total_seconds()))
            gaps.append((started[b] - completed[a]).total_seconds())
    return reaction, gaps


def ingest_rate(db: str, launcher_cls: Any, settings: Any, arms_n: int, records: int) -> tuple[int, float]:
    """(records stored, records per second from the first stored row to the last)."""
    from sqlalchemy import func, select

    from orchestrator.db.models import Metric
    from orchestrator.db.session import session_scope

    arms = [{"parent": "A", "name": f"i{i}"} for i in range(arms_n)]
    launcher = launcher_cls(settings, train_fn=SYNTHETIC)
    launcher.start()
    try:
        ids = _submit(db, arms, tiny_overrides(records, 1, warmup_steps=1))
        _wait_done(db, ids)
    finally:
        launcher.stop()
    with session_scope(db) as session:
        n, first, last = session.execute(
            select(func.count(), func.min(Metric.created_at), func.max(Metric.created_at)).where(
                Metric.run_id.in_(ids)
            )
        ).one()
    return n, n / max((last - first).total_seconds(), 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="postgresql+psycopg://postgres@127.0.0.1:55432/postgres")
    parser.add_argument("--gpus", type=int, default=4, help="logical GPUs for the latency and gap runs")
    parser.add_argument("--ingest-arms", type=int, default=32, help="concurrent arms (= logical GPUs) for ingest")
    parser.add_argument("--ingest-records", type=int, default=200, help="records per arm for ingest")
    parser.add_argument("--latency-runs", type=int, default=5)
    args = parser.parse_args()

    import ray

    from orchestrator.runs.launcher import Launcher
    from orchestrator.settings import Settings

    db, cleanup = _fresh_database(args.database_url)
    settings = Settings(
        database_url=db,
        home_dir=Path(tempfile.mkdtemp()),
        launcher_interval_s=0.5,
        worker_threads=1,
        ray_namespace="ablate-bench",
    )

    def start_ray(gpus: int, delay_s: float) -> None:
        """A fresh local Ray per phase: its GPU count, and the synthetic stream's record spacing."""
        ray.shutdown()
        ray.init(
            num_gpus=gpus,
            num_cpus=os.cpu_count(),
            namespace="ablate-bench",
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"ABLATE_BENCH_RECORD_DELAY_S": str(delay_s), "PYTHONPATH": str(BENCH_DIR)}},
        )

    try:
        start_ray(args.gpus, 0.0)
        lat = latency(db, Launcher, settings, args.latency_runs)
        start_ray(args.gpus, 0.5)
        reaction, gaps = idle_gaps(db, Launcher, settings, args.gpus, per_gpu=3)
        start_ray(args.ingest_arms, 0.0)
        n, rate = ingest_rate(db, Launcher, settings, args.ingest_arms, args.ingest_records)
    finally:
        ray.shutdown()
        cleanup()

    def fmt(xs: list[float]) -> str:
        return f"median {statistics.median(xs):.2f} s (min {min(xs):.2f}, max {max(xs):.2f}, n={len(xs)})"

    dialect = db.split(":", 1)[0]
    print(f"database: {dialect}; {os.cpu_count()} CPU cores; python {sys.version.split()[0]}; ray {ray.__version__}")
    print(f"submission -> worker up (synthetic stream):    {fmt(lat['started'])}")
    print(f"submission -> first record (synthetic stream): {fmt(lat['first_record'])}")
    print(f"submission -> worker up (real train_arm):      {fmt(lat['real_started'])}")
    print(f"submission -> first step (real train_arm):     {fmt(lat['real_first_step'])}")
    print(f"run end -> next run launched (launcher):     {fmt(reaction)}")
    print(f"idle gap on a GPU, run end -> next run up:     {fmt(gaps)}")
    print(f"ingest: {n} records from {args.ingest_arms} concurrent arms: {rate:.0f} records/s")


if __name__ == "__main__":
    main()
