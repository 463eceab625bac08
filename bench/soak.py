"""Soak and fault benchmark: the controller under load for a fixed time while faults are injected.

Real: Postgres (a throwaway cluster of our own, so restarting it disturbs nobody), the controller
process (`ablate serve`'s app: API, launcher, ingest, detector) on a local Ray with logical GPUs,
one Ray actor per run. Synthetic: the training stream (bench/orchestration.py's synthetic_train, the
same record shape, no torch work), so a 2-core machine can hold many arms at once.

Load: a submitter posts a 4-arm grid every --submit-every s; readers poll the grid list, one grid,
one run's metrics and the dashboard; a fuzzer sends malformed, oversized, deep, unauthenticated and
wrongly typed requests. Faults, one every --fault-every s in turn: Postgres restarted mid-ingest,
two workers kill -9, the controller kill -9 and restarted, the storage filesystem (a small tmpfs)
filled for --full-s s.

Prints (and writes --out as JSON): records produced vs stored (lost, duplicated), runs finished vs
submitted, requests/s with p50/p99 latency, peak controller RSS, 5xx count, recovery time per fault.

    python bench/soak.py --minutes 12          # as root (tmpfs mount, initdb as the postgres user)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from soak_env import BENCH_DIR, REPO, Env, free_port
from soak_load import (
    Stats,
    fault_controller,
    fault_postgres,
    fault_storage_full,
    fault_workers,
    fuzzer,
    reader,
    submitter,
    wait_healthy,
)

# -- the run ---------------------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def audit(env: Env, stats: Stats, steps: int, every: int) -> dict[str, Any]:
    """Records produced vs stored, duplicates, runs by state: read from the database."""
    from sqlalchemy import func, select

    from orchestrator.db.models import Event, Grid, Metric, Run
    from orchestrator.db.session import session_scope

    expected_steps = set(range(every, steps + 1, every))
    with session_scope(env.db) as session:
        grid_ids = set(session.scalars(select(Grid.id).where(Grid.name.like("soak-%"))).all())
        runs = session.execute(select(Run.id, Run.state, Run.error).where(Run.grid_id.in_(grid_ids))).all()
        stored = defaultdict(set)
        rows = session.execute(select(Metric.run_id, Metric.step).where(Metric.run_id.in_([r[0] for r in runs])))
        for run_id, step in rows:
            stored[run_id].add(step)
        # A checkpoint event is written once per newly stored step ("step N"): a second one is a duplicate.
        dup_events = session.execute(
            select(Event.run_id, Event.message, func.count())
            .where(Event.kind == "checkpoint", Event.run_id.in_([r[0] for r in runs]))
            .group_by(Event.run_id, Event.message)
            .having(func.count() > 1)
        ).all()
    states = Counter(r[1] for r in runs)
    completed = [r[0] for r in runs if r[1] == "completed"]
    lost = sum(len(expected_steps - stored[r]) for r in completed)
    unexpected = sum(len(stored[r] - expected_steps) for r in stored)
    return {
        "grids_acknowledged": len(stats.grids),
        "grids_stored": len(grid_ids),
        "runs_submitted": len(runs),
        "runs_by_state": dict(states),
        "runs_not_final": sum(n for s, n in states.items() if s not in ("completed", "stopped", "failed")),
        "failed_errors": Counter((r[2] or "").splitlines()[0][:120] for r in runs if r[1] == "failed").most_common(5),
        "records_produced_by_completed_runs": len(completed) * len(expected_steps),
        "records_stored": sum(len(v) for v in stored.values()),
        "records_lost_of_completed_runs": lost,
        "records_unexpected": unexpected,
        "duplicated_checkpoint_events": sum(n - 1 for *_, n in dup_events),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=12.0, help="load time (faults inside it)")
    ap.add_argument("--gpus", type=int, default=8, help="logical GPUs of the local Ray")
    ap.add_argument("--submit-every", type=float, default=20.0, help="seconds between 4-arm grids")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=5, help="checkpoint_every: records per run = steps / every")
    ap.add_argument("--record-delay", type=float, default=0.5, help="seconds between a run's records")
    ap.add_argument("--fault-every", type=float, default=75.0)
    ap.add_argument("--full-s", type=float, default=15.0, help="seconds the storage stays full")
    ap.add_argument("--storage-mb", type=int, default=64)
    ap.add_argument("--drain-timeout", type=float, default=600.0, help="seconds for the last runs to end")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import ray

    root = Path(tempfile.mkdtemp(prefix="ablate-soak-"))
    env = Env(root=root, pg_dir=root / "pg", pg_port=free_port(), storage=root / "storage", api_port=free_port())
    os.environ["PYTHONPATH"] = f"{REPO}:{BENCH_DIR}"  # the Ray workers import the synthetic stream
    os.environ["ABLATE_BENCH_RECORD_DELAY_S"] = str(args.record_delay)
    stats = Stats()
    faults: list[dict[str, Any]] = []
    stop = threading.Event()
    threads: list[threading.Thread] = []
    mounted = False
    try:
        env.start_postgres()
        env.mount_storage(args.storage_mb)
        mounted = True
        info = ray.init(num_gpus=args.gpus, num_cpus=2, namespace="ablate-soak", include_dashboard=False,
                        log_to_driver=False)
        env.ray_address = info.address_info["gcs_address"]
        env.start_controller(args.record_delay)
        if wait_healthy(env, 180) is None:
            raise SystemExit(f"the controller did not come up; see {root / 'controller.log'}")
        print(f"soak: Postgres :{env.pg_port}, storage tmpfs {args.storage_mb} MB, API :{env.api_port}, {root}")
        t_start = time.monotonic()
        threads = [
            threading.Thread(target=submitter, args=(env, stats, stop, args.submit_every, args.steps, args.every)),
            threading.Thread(target=reader, args=(env, stats, stop, 1)),
            threading.Thread(target=reader, args=(env, stats, stop, 2)),
            threading.Thread(target=fuzzer, args=(env, stats, stop, 3)),
        ]
        for t in threads:
            t.start()
        kinds = ["postgres", "workers", "controller", "storage"]
        next_fault, k = t_start + args.fault_every, 0
        while time.monotonic() - t_start < args.minutes * 60:
            env.sample_rss()
            if time.monotonic() >= next_fault:
                kind = kinds[k % len(kinds)]
                k += 1
                t_f = time.monotonic() - t_start
                result = {
                    "postgres": lambda: fault_postgres(env),
                    "workers": lambda: fault_workers(env),
                    "controller": lambda: fault_controller(env, args.record_delay),
                    "storage": lambda: fault_storage_full(env, args.full_s),
                }[kind]()
                result["at_s"] = round(t_f, 1)
                faults.append(result)
                print("fault:", json.dumps(result, default=str), flush=True)
                next_fault = time.monotonic() + args.fault_every
            time.sleep(1.0)
        load_s = time.monotonic() - t_start
        stop.set()
        for t in threads:
            t.join(60)
        # Drain: every submitted run must end.
        from sqlalchemy import func, select

        from orchestrator.db.models import Run
        from orchestrator.db.session import session_scope

        t_drain = time.monotonic()
        while time.monotonic() - t_drain < args.drain_timeout:
            env.sample_rss()
            with session_scope(env.db) as session:
                live = session.scalar(
                    select(func.count()).select_from(Run).where(Run.state.in_(("queued", "starting", "running")))
                )
            if not live:
                break
            time.sleep(1.0)
        report = {
            "command": " ".join(sys.argv),
            "load_s": round(load_s, 1),
            "drain_s": round(time.monotonic() - t_drain, 1),
            **audit(env, stats, args.steps, args.every),
            "requests": stats.requests,
            "requests_per_s": round(stats.requests / load_s, 1),
            "latency_ms": {
                kind: {"n": len(v), "p50": round(pct(v, 50) * 1000, 1), "p99": round(pct(v, 99) * 1000, 1)}
                for kind, v in stats.latencies.items()
            },
            "statuses": dict(stats.statuses),
            "fuzz_statuses": dict(stats.fuzz_statuses),
            "5xx": len(stats.server_errors),
            "5xx_by_status": dict(Counter(e.rsplit(" ", 1)[1] for e in stats.server_errors)),
            "5xx_samples": stats.server_errors[:20],
            "connection_refused_while_controller_down": stats.refused,
            "controller_rss_mb": {
                "peak": round(env.rss_peak_kb / 1024, 1),
                "first_minute_max": round(max(env.rss_samples[:60] or [0]) / 1024, 1),
                "last_minute_max": round(max(env.rss_samples[-60:] or [0]) / 1024, 1),
            },
            "faults": faults,
        }
        print(json.dumps(report, indent=2, default=str))
        if args.out:
            args.out.write_text(json.dumps(report, indent=2, default=str))
    finally:
        stop.set()
        if env.controller is not None and env.controller.poll() is None:
            env.controller.terminate()
            try:
                env.controller.wait(30)
            except subprocess.TimeoutExpired:
                env.controller.kill()
        if ray.is_initialized():
            ray.shutdown()
        if (env.pg_dir / "PG_VERSION").exists():
            try:
                env.pg_ctl("stop", "-m", "immediate")
            except subprocess.SubprocessError:
                pass
        if mounted:
            subprocess.run(["umount", str(env.storage)], check=False)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
