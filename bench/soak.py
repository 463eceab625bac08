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
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestration import tiny_overrides  # bench/orchestration.py: this script's directory is on sys.path

from tests.kit.net import free_port  # bench/orchestration.py puts the repository on sys.path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
SYNTHETIC = "orchestration:synthetic_train"  # importable by the workers: BENCH_DIR is on their PYTHONPATH
TOKEN = "soak-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PG_BIN = Path("/usr/lib/postgresql/15/bin")


# -- the controller process ------------------------------------------------------------------------------


def controller_main() -> None:
    """`python bench/soak.py controller`: the app `ablate serve` runs, its launcher on the synthetic stream."""
    import uvicorn

    from orchestrator.runs.launcher import Launcher
    from orchestrator.server import build_app
    from orchestrator.settings import load_settings

    settings = load_settings()
    worker_env = {
        "PYTHONPATH": f"{BENCH_DIR}:{REPO}",
        "ABLATE_BENCH_RECORD_DELAY_S": os.environ["ABLATE_BENCH_RECORD_DELAY_S"],
    }
    os.environ.update(worker_env)  # the local node's agent, its Ray and workers inherit it
    app = build_app(settings)
    launcher = Launcher(settings, train_fn=SYNTHETIC)
    app.state.startup_hooks.append(lambda _app: launcher.start())
    app.state.shutdown_hooks.append(lambda _app: launcher.stop())
    uvicorn.run(app, host="127.0.0.1", port=settings.port, log_level="warning")


# -- the environment: Postgres, tmpfs storage, Ray, the controller -----------------------------------------


@dataclass
class Env:
    root: Path
    pg_dir: Path
    pg_port: int
    storage: Path
    api_port: int
    ray_address: str = ""
    controller: subprocess.Popen | None = None
    controller_log: Any = None
    rss_peak_kb: int = 0
    rss_samples: list[int] = field(default_factory=list)

    @property
    def db(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.pg_port}/postgres"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def pg_ctl(self, *args: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", str(PG_BIN / "pg_ctl"), "-D", str(self.pg_dir), "-w", *args],
            check=True, capture_output=True, timeout=120,
        )

    def start_postgres(self) -> None:
        self.root.chmod(0o711)  # the postgres user must reach its data directory inside our temp dir
        self.pg_dir.mkdir(parents=True)
        shutil.chown(self.pg_dir, "postgres", "postgres")
        subprocess.run(
            ["runuser", "-u", "postgres", "--", str(PG_BIN / "initdb"), "-A", "trust", "-U", "postgres", "-D",
             str(self.pg_dir)], check=True, capture_output=True, timeout=120,
        )
        opts = f"-p {self.pg_port} -k {self.pg_dir} -c listen_addresses=127.0.0.1 -c fsync=on"
        self.pg_ctl("-o", opts, "-l", str(self.pg_dir / "log"), "start")

    def mount_storage(self, size_mb: int) -> None:
        self.storage.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", str(self.storage)],
                       check=True)

    def start_controller(self, delay_s: float) -> None:
        env = {
            **os.environ,
            "ABLATE_DATABASE_URL": self.db,
            "ABLATE_API_TOKEN": TOKEN,
            "ABLATE_HOME_DIR": str(self.storage),
            "ABLATE_PORT": str(self.api_port),
            "ABLATE_RAY_ADDRESS": self.ray_address,
            "ABLATE_RAY_NAMESPACE": "ablate-soak",
            "ABLATE_MAX_RETRIES": "20",  # many kill -9s: a run must not run out of retries in the soak
            "ABLATE_LAUNCHER_INTERVAL_S": "0.5",
            "ABLATE_BENCH_RECORD_DELAY_S": str(delay_s),
            "PYTHONPATH": f"{REPO}:{BENCH_DIR}",
        }
        self.controller_log = (self.root / "controller.log").open("a")
        self.controller = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "controller"], env=env, cwd=self.root,
            stdout=self.controller_log, stderr=subprocess.STDOUT,
        )

    def sample_rss(self) -> None:
        proc = self.controller
        if proc is None or proc.poll() is not None:
            return
        try:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    kb = int(line.split()[1])
                    self.rss_samples.append(kb)
                    self.rss_peak_kb = max(self.rss_peak_kb, kb)
        except OSError:
            pass


# -- load ------------------------------------------------------------------------------------------------------


@dataclass
class Stats:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: Counter = field(default_factory=Counter)
    fuzz_statuses: Counter = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)  # 5xx: method path status
    refused: int = 0  # connection refused/reset: the controller was down (kill -9 window)
    requests: int = 0
    grids: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, kind: str, method: str, path: str, status: int, seconds: float, fuzz: bool = False) -> None:
        with self.lock:
            self.requests += 1
            (self.fuzz_statuses if fuzz else self.statuses)[status] += 1
            if status >= 500:
                self.server_errors.append(f"{time.strftime('%H:%M:%S')} {method} {path} {status}")
            if status < 500:
                self.latencies[kind].append(seconds)


def _request(client: Any, stats: Stats, kind: str, method: str, path: str, fuzz: bool = False, **kw: Any) -> Any:
    import httpx

    t0 = time.perf_counter()
    try:
        resp = client.request(method, path, **kw)
    except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, httpx.ReadTimeout):
        with stats.lock:
            stats.refused += 1
        return None
    stats.note(kind, method, path, resp.status_code, time.perf_counter() - t0, fuzz)
    return resp


def submitter(env: Env, stats: Stats, stop: threading.Event, every_s: float, steps: int, ckpt: int) -> None:
    import httpx

    n = 0
    with httpx.Client(base_url=env.base, timeout=30) as client:
        while not stop.is_set():
            overrides = tiny_overrides(steps, ckpt, warmup_steps=1)
            body = {"name": f"soak-{n}", "arms": ["A", "B", "C", "D"], "overrides": overrides}
            resp = _request(client, stats, "submit", "POST", "/api/grids", json=body, headers=AUTH)
            if resp is not None and resp.status_code == 201:
                with stats.lock:
                    stats.grids.append(resp.json()["id"])
                n += 1
                stop.wait(every_s)
            else:
                stop.wait(1.0)  # controller down or DB restarting: retry the same grid


def reader(env: Env, stats: Stats, stop: threading.Event, seed: int) -> None:
    import httpx

    rng = random.Random(seed)
    with httpx.Client(base_url=env.base, timeout=30) as client:
        while not stop.is_set():
            with stats.lock:
                grids = list(stats.grids[-20:])
            choice = rng.random()
            if choice < 0.3 or not grids:
                _request(client, stats, "read", "GET", "/api/grids", params={"limit": 20})
            elif choice < 0.55:
                _request(client, stats, "read", "GET", f"/api/grids/{rng.choice(grids)}")
            elif choice < 0.75:
                _request(client, stats, "read", "GET", "/api/dashboard/grids")
            elif choice < 0.9:
                resp = _request(client, stats, "read", "GET", f"/api/grids/{rng.choice(grids)}")
                if resp is not None and resp.status_code == 200 and resp.json()["runs"]:
                    run = rng.choice(resp.json()["runs"])["id"]
                    _request(client, stats, "read", "GET", f"/api/runs/{run}/metrics")
            else:
                _request(client, stats, "read", "GET", "/")
            stop.wait(0.05)


FUZZ_BODIES: list[tuple[str, bytes, dict[str, str]]] = [
    ("malformed", b'{"name": "x", "arms": [', {}),
    ("deep", b"[" * 5000 + b"]" * 5000, {}),
    ("oversized", b'{"name": "' + b"x" * (2 << 20) + b'"}', {}),
    ("huge int", b'{"name": "x", "arms": ["A"], "overrides": {"model": {"hidden": 4000000000000000000000}}}', {}),
    ("wrong types", b'{"name": 5, "arms": "A", "overrides": []}', {}),
    ("bad utf-8", b'{"name": "\xff\xfe", "arms": ["A"]}', {}),
    ("nul", b'{"name": "a\\u0000b", "arms": ["A"]}', {}),
    ("unknown key", b'{"name": "x", "arms": [{"parent": "A", "optimzer": {}}]}', {}),
    ("code path", b'{"name": "x", "arms": ["A"], "overrides": {"repa": {"enabled": true, "teacher_path": "/tmp/hub"}}}',
     {}),
    ("absurd memory", b'{"name": "x", "arms": ["A"], "overrides": {"model": {"depth": 512, "hidden": 16384}}}', {}),
]


def fuzzer(env: Env, stats: Stats, stop: threading.Event, seed: int) -> None:
    import httpx

    rng = random.Random(seed)
    with httpx.Client(base_url=env.base, timeout=30) as client:
        while not stop.is_set():
            name, body, _ = rng.choice(FUZZ_BODIES)
            headers = {"content-type": "application/json"}
            if rng.random() < 0.7:
                headers.update(AUTH)
            _request(client, stats, "fuzz", "POST", "/api/grids", fuzz=True, content=body, headers=headers)
            path = rng.choice(["/api/grids/-1", "/api/grids/99999999999", "/api/runs/abc", "/api/nodes",
                               "/api/runs/1/stop", "/api/dashboard/grids?limit=0", "/api/grids?offset=-5"])
            method = "POST" if path.endswith("/stop") else "GET"
            _request(client, stats, "fuzz", method, path, fuzz=True)
            stop.wait(0.2)


# -- faults ----------------------------------------------------------------------------------------------------


def newest_metric_id(env: Env) -> int:
    from sqlalchemy import func, select

    from orchestrator.db.models import Metric
    from orchestrator.db.session import session_scope

    with session_scope(env.db) as session:
        return session.scalar(select(func.max(Metric.id))) or 0


def wait_ingest_after(env: Env, mark: int, timeout: float = 300.0) -> float | None:
    """Seconds until a metric newer than `mark` is stored (ingest flowing again), or None."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if newest_metric_id(env) > mark:
                return time.monotonic() - t0
        except Exception:  # noqa: BLE001 - the database may still be coming back
            pass
        time.sleep(0.2)
    return None


def wait_healthy(env: Env, timeout: float = 120.0) -> float | None:
    import httpx

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if httpx.get(f"{env.base}/api/grids", params={"limit": 1}, timeout=5).status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return None


def fault_postgres(env: Env) -> dict[str, Any]:
    mark = newest_metric_id(env)
    t0 = time.monotonic()
    env.pg_ctl("-l", str(env.pg_dir / "log"), "restart", "-m", "fast")  # -l: else the server holds our pipe
    restarted = time.monotonic() - t0
    api = wait_healthy(env)
    ingest = wait_ingest_after(env, mark)
    return {"fault": "postgres restart (-m fast)", "down_s": restarted, "api_ok_s": api, "ingest_s": ingest}


def fault_workers(env: Env, n: int = 2) -> dict[str, Any]:
    import ray
    from sqlalchemy import select

    from orchestrator.db.models import Run
    from orchestrator.db.session import session_scope
    from worker.protocol import worker_name

    running: list[Any] = []
    t_wait = time.monotonic()
    while not running and time.monotonic() - t_wait < 120:  # between grids no worker may be up
        with session_scope(env.db) as session:
            running = session.execute(select(Run.id, Run.retries).where(Run.state == "running")).all()
        time.sleep(0.5)
    killed = []
    for run_id, retries in random.sample(running, min(n, len(running))):
        try:
            actor = ray.get_actor(worker_name(run_id, retries), namespace="ablate-soak")
            pid = ray.get(actor.ping.remote(), timeout=10)["pid"]
            os.kill(pid, signal.SIGKILL)
            killed.append(run_id)
        except Exception:  # noqa: BLE001 - it finished meanwhile
            continue
    t0 = time.monotonic()
    # Recovered: every killed run is running again on a new attempt (or final).
    while time.monotonic() - t0 < 300:
        with session_scope(env.db) as session:
            rows = session.execute(select(Run.state, Run.retries).where(Run.id.in_(killed))).all()
        if all(state in ("completed", "stopped", "failed") or (state == "running" and r > 0) for state, r in rows):
            break
        time.sleep(0.2)
    return {"fault": f"kill -9 of {len(killed)} workers", "runs": killed, "rerunning_s": time.monotonic() - t0}


def fault_controller(env: Env, delay_s: float) -> dict[str, Any]:
    assert env.controller is not None
    env.controller.send_signal(signal.SIGKILL)
    env.controller.wait()
    mark = newest_metric_id(env)
    time.sleep(2.0)  # down for a moment, as a crashed host would be
    env.start_controller(delay_s)
    api = wait_healthy(env)
    ingest = wait_ingest_after(env, mark)
    return {"fault": "controller kill -9 and restart", "api_ok_s": api, "ingest_s": ingest}


def fault_storage_full(env: Env, hold_s: float) -> dict[str, Any]:
    filler = env.storage / "filler"
    with filler.open("wb") as fh:
        try:
            while True:
                fh.write(b"\0" * (1 << 20))
                fh.flush()
        except OSError:
            pass
    free_mb = shutil.disk_usage(env.storage).free / 2**20
    time.sleep(hold_s)
    mark = newest_metric_id(env)
    filler.unlink()
    ingest = wait_ingest_after(env, mark)
    return {"fault": f"storage full for {hold_s:g} s", "free_mb_while_full": round(free_mb, 2),
            "ingest_after_freeing_s": ingest}


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
    if sys.argv[1:2] == ["controller"]:
        sys.path.insert(0, str(BENCH_DIR))
        controller_main()
    else:
        main()
