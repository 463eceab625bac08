"""The soak benchmark's load and faults (bench/soak.py): a grid submitter, readers, a fuzzer of malformed
requests, and the faults injected in turn (Postgres restarted, workers and the controller killed, storage full)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from orchestration import tiny_overrides  # bench/orchestration.py: this script's directory is on sys.path
from soak_env import AUTH, Env

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
    from worker.worker_names import worker_name

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
