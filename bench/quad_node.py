"""A real grid on one multi-GPU node through the real controller (issue 8).

Starts `ablate serve` exactly as a user would (SQLite, a local Ray head that sees the node's GPUs),
submits arms A, B, G, H and I over REST, watches the database while they run, and prints what it
checked: each running arm on its own GPU (UUIDs from the worker's own record against `nvidia-smi -L`),
the fifth arm queued until a GPU freed and then started on it, metrics in the DB while arms ran,
per-arm samples/s, tokens/s and peak memory, arm I's speed over arm G, and the detector's decisions.

On the GPU machine: `bash bench/quad_node.sh` (installs the carried wheels, then runs this).
Dry run on a CPU machine with logical GPUs:
    PYTHONPATH=. ABLATE_LOGICAL_GPUS=4 python bench/quad_node.py --size tiny --steps 40 --every 20 --batch 8
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

ARMS = ["A", "B", "G", "H", "I"]
TERMINAL = {"completed", "stopped", "failed"}
TOKEN = "quad-node-token-0123"


def nvidia_smi_uuids() -> dict[str, str]:
    """GPU UUID -> 'index: name' from `nvidia-smi -L`, empty where there is no nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return {}
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    uuids = {}
    for line in out.splitlines():  # GPU 0: NVIDIA H200 (UUID: GPU-...)
        if "UUID:" in line:
            uuids[line.split("UUID:")[1].strip(" )")] = line.split(" (UUID")[0]
    return uuids


def bench_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """What both controller benches override (this one and bench/controller_gpu.py): shapes data, the schedule
    from the flags, and the labelled stand-in LPIPS backbone (no pretrained weights reach the GPU machine)."""
    return {
        "model": {"size": args.size},
        "data": {"dataset": "shapes", "num_images": 4096, "held_out": 16},
        "schedule": {
            "steps": args.steps,
            "batch_size": args.batch,
            "warmup_steps": max(1, args.steps // 10),
            "checkpoint_every": args.every,
            "ema": {"warmup_steps": max(1, args.steps // 5)},
        },
        "eval": {"num_samples": 16, "sampler_steps": 20, "lpips_backbone": "random_standin"},
    }


def grid_body(args: argparse.Namespace) -> dict[str, Any]:
    overrides = {
        **bench_overrides(args),
        # No pretrained teacher on the node: the labelled stand-in (recorded on every run).
        "repa": {"teacher": "random_standin"},
        "precision": {"compile": args.compile},
    }
    return {"name": f"quad-node {args.size} x{args.steps}", "arms": ARMS, "overrides": overrides, "control": "A"}


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"ablate serve exited with {proc.returncode} before it was healthy")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"ablate serve not healthy after {timeout_s} s")


@contextlib.contextmanager
def serving(home: Path, port: int, token: str, **env: str) -> Iterator[str]:
    """`ablate serve` as a user starts it (SQLite and storage under home; env added to this environment),
    healthy: yields its URL. On leaving it is stopped with SIGINT (SIGKILL after 30 s), and if it ended any
    other way the tail of its log (home/serve.log) is printed."""
    env = dict(os.environ, ABLATE_DATABASE_URL=f"sqlite:///{home / 'ablate.db'}", ABLATE_HOME_DIR=str(home),
               ABLATE_API_TOKEN=token, ABLATE_PORT=str(port), PYTHONUNBUFFERED="1", **env)
    url = f"http://127.0.0.1:{port}"
    with open(home / "serve.log", "w") as log:
        server = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "serve"], env=env, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_healthy(url, server)
            yield url
        finally:
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGINT)
                try:
                    server.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(server.pid, signal.SIGKILL)
                    server.wait()
            if server.returncode not in (0, -signal.SIGINT):
                print("--- ablate serve log (tail) ---\n" + (home / "serve.log").read_text()[-6000:], flush=True)


def submit_grid(url: str, token: str, body: dict[str, Any]) -> int:
    resp = httpx.post(f"{url}/api/grids", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    resp.raise_for_status()
    return resp.json()["id"]


def watch(url: str, grid_id: int, timeout_s: float) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]]]:
    """Poll the grid every second until every run is final. Returns the timeline of state changes and
    the metric count per run seen while that run was still running."""
    timeline: list[dict[str, Any]] = []
    last_state: dict[int, str] = {}
    live_metrics: dict[int, dict[str, Any]] = {}
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        grid = httpx.get(f"{url}/api/grids/{grid_id}", timeout=10).json()
        for run in grid["runs"]:
            if last_state.get(run["id"]) != run["state"]:
                last_state[run["id"]] = run["state"]
                detail = httpx.get(f"{url}/api/runs/{run['id']}", timeout=10).json()
                # Real GPUs: the UUID the worker read itself; logical ones: the CUDA_VISIBLE_DEVICES Ray set.
                gpu = detail.get("gpu_uuid") or (f"cvd:{detail['gpu_index']}" if detail.get("gpu_index") else None)
                timeline.append({"t": round(time.monotonic() - t0, 1), "run": run["id"], "arm": run["arm"],
                                 "state": run["state"], "gpu_uuid": gpu})
                print(f"[{timeline[-1]['t']:7.1f}s] {run['arm']} -> {run['state']} {gpu or ''}", flush=True)
            if run["state"] == "running":
                n = len(httpx.get(f"{url}/api/runs/{run['id']}/metrics", timeout=10).json())
                if n:
                    live_metrics.setdefault(run["id"], {"arm": run["arm"], "max_rows_while_running": 0})
                    live_metrics[run["id"]]["max_rows_while_running"] = max(
                        n, live_metrics[run["id"]]["max_rows_while_running"]
                    )
        if all(r["state"] in TERMINAL for r in grid["runs"]):
            return timeline, live_metrics
        time.sleep(1.0)
    raise SystemExit(f"grid {grid_id} not finished after {timeout_s} s")


def intervals(timeline: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per run: when it started running, when it ended, on which GPU."""
    out: dict[int, dict[str, Any]] = {}
    for ev in timeline:
        r = out.setdefault(ev["run"], {"arm": ev["arm"], "start": None, "end": None, "uuid": None})
        if ev["state"] == "running" and r["start"] is None:
            r["start"], r["uuid"] = ev["t"], ev["gpu_uuid"]
        if ev["state"] in TERMINAL:
            r["end"] = ev["t"]
            r["uuid"] = r["uuid"] or ev["gpu_uuid"]
    return out


def check(url: str, grid_id: int, timeline: list[dict[str, Any]], live: dict[int, dict[str, Any]]) -> str:
    grid = httpx.get(f"{url}/api/grids/{grid_id}", timeout=10).json()
    runs = {r["id"]: httpx.get(f"{url}/api/runs/{r['id']}", timeout=10).json() for r in grid["runs"]}
    metrics = {rid: httpx.get(f"{url}/api/runs/{rid}/metrics", timeout=10).json() for rid in runs}
    spans = intervals(timeline)
    smi = nvidia_smi_uuids()
    lines = [f"grid {grid_id}: {len(runs)} arms, device: {', '.join(sorted(set(smi.values()))) or 'logical GPUs'}"]

    # 1. No two arms on one GPU at the same time; each UUID is one nvidia-smi lists.
    overlaps = []
    ids = sorted(spans)
    for i, a in enumerate(ids):
        for b in ids[i + 1:]:
            sa, sb = spans[a], spans[b]
            if sa["uuid"] and sa["uuid"] == sb["uuid"] and sa["start"] < (sb["end"] or 1e9) and sb["start"] < (
                sa["end"] or 1e9
            ):
                overlaps.append((sa["arm"], sb["arm"]))
    lines.append(f"two arms on one GPU at once: {overlaps or 'never'}")
    unknown = [s["uuid"] for s in spans.values() if smi and s["uuid"] not in smi]
    lines.append(f"worker UUIDs not in nvidia-smi -L: {unknown or 'none'}")
    first_four = sorted((s for s in spans.values() if s["start"] is not None), key=lambda s: s["start"])
    concurrent = {s["uuid"] for s in first_four[:4]}
    lines.append(f"distinct GPUs among the first four running arms: {len(concurrent)}")

    # 2. The fifth arm waited for a GPU and started on the one that freed.
    fifth = first_four[4] if len(first_four) > 4 else None
    if fifth is not None:
        freed = [s for s in first_four[:4] if s["end"] is not None and s["end"] <= fifth["start"] + 1.0]
        on_freed = any(s["uuid"] == fifth["uuid"] for s in freed)
        lines.append(
            f"fifth arm {fifth['arm']} started at {fifth['start']} s, after "
            f"{', '.join(s['arm'] + '@' + str(s['end']) for s in freed) or 'nothing'} freed; "
            f"on a freed GPU: {on_freed}"
        )

    # 3. Metrics reached the DB while arms were running.
    lines.append("metric rows seen while running: " + ", ".join(
        f"{v['arm']}={v['max_rows_while_running']}" for v in live.values()) if live else "none seen while running")

    # 4. Per-arm throughput, memory, decisions.
    table = ["| arm | GPU | state | decision | checkpoints | best recon LPIPS (step) | samples/s | tokens/s | "
             "peak mem GB | fallbacks |", "|---|---|---|---|---|---|---|---|---|---|"]
    speed: dict[str, float] = {}
    for rid, run in runs.items():
        rows = metrics[rid]
        sps = [m["samples_per_sec"] for m in rows if m.get("samples_per_sec")]
        tps = [m["tokens_per_sec"] for m in rows if m.get("tokens_per_sec")]
        mem = max((m.get("peak_memory_gb") or 0 for m in rows), default=0)
        speed[run["arm"]] = sum(sps) / len(sps) if sps else 0.0
        gpu = (run.get("gpu_uuid") or f"cvd:{run.get('gpu_index')}")[:15]
        best = f"{run['best_value']:.4f} ({run['best_step']})" if run.get("best_value") is not None else "-"
        table.append(
            f"| {run['arm']} | {gpu} | {run['state']} | {run.get('decision') or '-'} | {len(rows)} | {best} | "
            f"{speed[run['arm']]:.1f} | {(sum(tps) / len(tps) if tps else 0):,.0f} | {mem:.1f} | "
            f"{'; '.join(run.get('fallbacks') or []) or '-'} |"
        )
    if speed.get("G"):
        lines.append(f"arm I over arm G (samples/s): {speed.get('I', 0) / speed['G']:.3f}x")
    return "\n".join(lines + [""] + table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="small", choices=["tiny", "small", "seed"])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=100, help="checkpoint interval")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--timeout", type=float, default=480)
    ap.add_argument("--out", type=Path, default=None, help="write the report here")
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="ablate-quad-"))
    t_start = time.monotonic()
    try:
        with serving(home, args.port, TOKEN) as url:
            print(f"controller healthy after {time.monotonic() - t_start:.1f} s", flush=True)
            grid_id = submit_grid(url, TOKEN, grid_body(args))
            timeline, live = watch(url, grid_id, args.timeout)
            report = check(url, grid_id, timeline, live)
            header = (f"`python bench/quad_node.py --size {args.size} --steps {args.steps} --every {args.every} "
                      f"--batch {args.batch}{' --compile' if args.compile else ''}`, {datetime.now():%Y-%m-%d}, "
                      f"wall {time.monotonic() - t_start:.0f} s")
            report = header + "\n\n" + report + "\n\ntimeline:\n" + json.dumps(timeline)
            print(report, flush=True)
            if args.out:
                args.out.write_text(report)
    finally:
        if args.out:
            shutil.copy(home / "serve.log", args.out.with_suffix(".serve.log"))


if __name__ == "__main__":
    main()
