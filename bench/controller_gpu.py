"""The real controller on one real GPU: a three-arm grid queues, takes the GPU in turn, and one arm is
stopped over REST mid-run (issue 27, item 4).

Starts `ablate serve` as a user would (SQLite, a local Ray head that detects the machine's one GPU:
ABLATE_LOGICAL_GPUS unset/0, checkpoints to a local `file://` store), submits arms A, B and C at `small`
size over REST with the trainer's defaults (micro-batch auto, compile on CUDA), watches the REST API every
second, stops B over REST once its first checkpoint is recorded, and prints what it checked:

- one arm runs at a time; the others are queued, and each takes the GPU when the one before it ends;
- the worker's own GPU UUID (from the run record) is one `nvidia-smi -L` lists;
- metric rows reach the API while each arm is still running;
- the stopped arm ends `stopped` (decision user) before its last step, and its best checkpoint is in the
  `file://` store (best.pt under the run's prefix) and named on the run;
- the records show the micro-batch, accumulation and compile in effect, and the tokens/s.

On the GPU machine: `bash bench/controller_gpu.sh` (installs the carried wheels and Ray, then runs this).
Dry run on a CPU machine with one logical GPU:
    PYTHONPATH=. ABLATE_LOGICAL_GPUS=1 python bench/controller_gpu.py --size tiny --steps 40 --every 10 --batch 8
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench.quad_node import TERMINAL, bench_overrides, nvidia_smi_uuids, serving, submit_grid

ARMS = ["A", "B", "C"]
STOP_ARM = "B"
TOKEN = "controller-gpu-token-0123"
RECORD_KEYS = ("micro_batch", "grad_accum", "micro_batch_how", "compiled", "compile_s", "loader_workers")


def grid_body(args: argparse.Namespace) -> dict[str, Any]:
    # The trainer's defaults otherwise (compile on CUDA, micro-batch auto); A, B, C use no REPA teacher.
    overrides = bench_overrides(args)
    return {"name": f"controller-gpu {args.size} x{args.steps}", "arms": ARMS, "overrides": overrides, "control": "A"}


def get(url: str, path: str) -> Any:
    resp = httpx.get(f"{url}{path}", timeout=10)
    resp.raise_for_status()
    return resp.json()


def watch(url: str, grid_id: int, timeout_s: float) -> dict[str, Any]:
    """Poll every second until every run is final; stop STOP_ARM once it has a checkpoint row.

    Returns the timeline of state changes (with every other run's state at that moment), the metric rows
    seen per run while it was running, and the stop request's time and step."""
    timeline: list[dict[str, Any]] = []
    last: dict[int, str] = {}
    live: dict[str, int] = {}
    stop: dict[str, Any] = {}
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        grid = get(url, f"/api/grids/{grid_id}")
        states = {r["arm"]: r["state"] for r in grid["runs"]}
        for run in grid["runs"]:
            if last.get(run["id"]) != run["state"]:
                last[run["id"]] = run["state"]
                detail = get(url, f"/api/runs/{run['id']}")
                others = {a: s for a, s in states.items() if a != run["arm"]}
                ev = {"t": round(time.monotonic() - t0, 1), "arm": run["arm"], "state": run["state"],
                      "gpu_uuid": detail.get("gpu_uuid"), "others": others}
                timeline.append(ev)
                print(f"[{ev['t']:6.1f}s] {run['arm']} -> {run['state']} {ev['gpu_uuid'] or ''} others {ev['others']}",
                      flush=True)
            if run["state"] == "running":
                rows = get(url, f"/api/runs/{run['id']}/metrics")
                live[run["arm"]] = max(live.get(run["arm"], 0), len(rows))
                if run["arm"] == STOP_ARM and rows and not stop:
                    resp = httpx.post(f"{url}/api/runs/{run['id']}/stop", headers={"Authorization": f"Bearer {TOKEN}"},
                                      timeout=10)
                    stop = {"t": round(time.monotonic() - t0, 1), "http": resp.status_code,
                            "latest_step_at_request": rows[-1]["step"]}
                    print(f"[{stop['t']:6.1f}s] POST /api/runs/{run['id']}/stop -> {resp.status_code} "
                          f"(latest checkpoint step {stop['latest_step_at_request']})", flush=True)
        if all(r["state"] in TERMINAL for r in grid["runs"]):
            return {"timeline": timeline, "live": live, "stop": stop}
        time.sleep(1.0)
    raise SystemExit(f"grid {grid_id} not finished after {timeout_s} s; timeline: {json.dumps(timeline)}")


def store_path(url: str | None) -> Path | None:
    return Path(url.removeprefix("file://")) if url and url.startswith("file://") else None


def check(url: str, grid_id: int, seen: dict[str, Any], steps: int) -> tuple[list[str], list[str]]:
    """(lines of checks, markdown table of runs)."""
    grid = get(url, f"/api/grids/{grid_id}")
    runs = {r["arm"]: get(url, f"/api/runs/{r['id']}") for r in grid["runs"]}
    metrics = {arm: get(url, f"/api/runs/{r['id']}/metrics") for arm, r in runs.items()}
    smi = nvidia_smi_uuids()
    tl = seen["timeline"]
    lines = [f"grid {grid_id}: arms {', '.join(runs)}; device: {', '.join(sorted(set(smi.values()))) or 'logical GPU'}"]

    # One running at a time, the others queued meanwhile, each taking the GPU after the one before ended.
    spans: dict[str, dict[str, float | None]] = {a: {"start": None, "end": None} for a in runs}
    for ev in tl:
        if ev["state"] in ("starting", "running") and spans[ev["arm"]]["start"] is None:
            spans[ev["arm"]]["start"] = ev["t"]
        if ev["state"] in TERMINAL:
            spans[ev["arm"]]["end"] = ev["t"]
    order = sorted((a for a in spans if spans[a]["start"] is not None), key=lambda a: spans[a]["start"])
    overlaps = [(a, b) for i, a in enumerate(order) for b in order[i + 1:]
                if spans[b]["start"] < (spans[a]["end"] or 1e9) and spans[a]["start"] < (spans[b]["end"] or 1e9)]
    lines.append(f"order of start: {' -> '.join(order)}; two arms started or running at once: {overlaps or 'never'}")
    for ev in tl:
        if ev["state"] == "running":
            lines.append(f"  {ev['arm']} running at {ev['t']} s while the others were {ev['others']}")
    for prev, nxt in zip(order, order[1:], strict=False):
        lines.append(f"  {nxt} started {spans[nxt]['start']} s, after {prev} ended {spans[prev]['end']} s")

    uuids = {a: r.get("gpu_uuid") for a, r in runs.items()}
    same = len({u for u in uuids.values() if u}) == 1
    unknown = [u for u in uuids.values() if smi and u not in smi]
    lines.append(f"worker GPU UUIDs: {uuids}; one GPU for all: {same}; not in nvidia-smi -L: {unknown or 'none'}")
    lines.append(f"metric rows seen through the API while each arm was running: {seen['live']}")

    b = runs[STOP_ARM]
    store = store_path(b.get("checkpoint_url"))
    stored = sorted(p.name for p in store.iterdir()) if store and store.is_dir() else []
    best_local = b.get("best_checkpoint")
    lines.append(
        f"stop {STOP_ARM} over REST: {seen['stop']}; state {b['state']}, stop_requested {b.get('stop_requested')}, "
        f"decision {b.get('decision')}, "
        f"last checkpoint step {b.get('last_checkpoint_step')} of {steps}, best step {b.get('best_step')} "
        f"(recon {b.get('best_value')}); best_checkpoint {best_local}"
    )
    lines.append(f"  store {b.get('checkpoint_url')}: {stored}; best.pt there: {'best.pt' in stored}")
    if store and "best.pt" in stored:
        from worker import checkpoint as ckpt  # the stored best.pt: which step it holds

        state = ckpt.load(store / "best.pt", map_location="cpu")
        lines.append(f"  stored best.pt holds step {state['step']} (the run's best_step {b.get('best_step')}, "
                     f"best recon {state['best']})")

    table = ["| arm | state | decision | checkpoints | last step | best recon* (step) | tokens/s | micro-batch x accum "
             "| how | compiled | compile_s | peak mem GB | fallbacks |", "|" + "---|" * 13]
    for arm, run in runs.items():
        rows = metrics[arm]
        last = rows[-1] if rows else {}
        extra = last.get("extra") or {}
        rec = {k: last.get(k, extra.get(k)) for k in RECORD_KEYS}
        tps = [m["tokens_per_sec"] for m in rows if m.get("tokens_per_sec")]
        best = f"{run['best_value']:.4f} ({run['best_step']})" if run.get("best_value") is not None else "-"
        mem = max((m.get("peak_memory_gb") or 0 for m in rows), default=0)
        table.append(
            f"| {arm} | {run['state']} | {run.get('decision') or '-'} | {len(rows)} | "
            f"{run.get('last_checkpoint_step')} "
            f"| {best} | {(max(tps) if tps else 0):,.0f} | {rec['micro_batch']} x {rec['grad_accum']} | "
            f"{rec['micro_batch_how']} | {rec['compiled']} | "
            f"{rec['compile_s'] if rec['compile_s'] is None else round(rec['compile_s'], 1)} | {mem:.1f} | "
            f"{'; '.join(run.get('fallbacks') or []) or '-'} |"
        )
    return lines, table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="small", choices=["tiny", "small", "seed"])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=100, help="checkpoint interval")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--port", type=int, default=8766)
    ap.add_argument("--timeout", type=float, default=420)
    ap.add_argument("--out", type=Path, default=None, help="write the report here (and the serve log beside it)")
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="ablate-ctl-gpu-"))
    store = f"file://{home / 'store'}"
    gpus = os.environ.get("ABLATE_LOGICAL_GPUS", "0")  # 0: Ray detects the real GPU
    t_start = time.monotonic()
    report = ""
    try:
        with serving(home, args.port, TOKEN, ABLATE_CHECKPOINT_URL=store, ABLATE_LOGICAL_GPUS=gpus) as url:
            print(f"controller healthy after {time.monotonic() - t_start:.1f} s", flush=True)
            grid_id = submit_grid(url, TOKEN, grid_body(args))
            seen = watch(url, grid_id, args.timeout)
            lines, table = check(url, grid_id, seen, args.steps)
            header = (f"`python bench/controller_gpu.py --size {args.size} --steps {args.steps} --every {args.every} "
                      f"--batch {args.batch}`, {datetime.now():%Y-%m-%d}, wall {time.monotonic() - t_start:.0f} s, "
                      f"ABLATE_LOGICAL_GPUS={gpus}, checkpoint store {store}")
            report = "\n".join([header, "", *lines, "", *table, "", "timeline:", json.dumps(seen["timeline"])])
            print(report, flush=True)
    finally:
        if args.out and report:
            args.out.write_text(report + "\n")
        if args.out:
            args.out.with_suffix(".serve.log").write_text((home / "serve.log").read_text()[-2_000_000:])
        elif not report:
            print("--- ablate serve log (tail) ---\n" + (home / "serve.log").read_text()[-6000:], flush=True)


if __name__ == "__main__":
    main()
