"""An arm grown onto a freed GPU on real GPUs (issue 48): two arms of a `gpus_per_arm: "auto"` grid on a
node of two GPUs, one GPU each; once A has written its first checkpoint the user stops B (its GPU frees),
and the launcher grows A from 1 GPU to 2 at its next step when the redrawn night says it pays
(orchestrator/runs/grow.py). Through `ablate serve` and REST, as a user would.

It reports the grow events, A's records (step, ranks, tokens/s, wall time, compile_s), the resume's cost
(from the stop asked to the first record on two GPUs, against the steps it trained meanwhile), and A's
tokens/s on one GPU and on two.

On the GPU machine (two GPUs), after the carried wheels (bench/quad_node.sh's first lines):
    python3 bench/grow_gpu.py --steps 500 --every 250 --batch 32 --out $OUT/grow.md
Dry run on a CPU machine with logical GPUs:
    PYTHONPATH=. ABLATE_LOGICAL_GPUS=2 python bench/grow_gpu.py --size tiny --steps 30 --every 10 --batch 8
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quad_node import TOKEN, bench_overrides, serving  # noqa: E402 - a bench beside it

AUTH = {"Authorization": f"Bearer {TOKEN}"}
TERMINAL = {"completed", "stopped", "failed"}


def grid_body(args: argparse.Namespace) -> dict[str, Any]:
    overrides = {**bench_overrides(args), "repa": {"teacher": "random_standin"},
                 "precision": {"compile": args.size != "tiny"}}  # fmt: skip
    # a lighter evaluation than quad_night's (about 75 s a checkpoint at seed size): the growth is the point
    overrides["eval"] = {**overrides["eval"], "num_samples": args.eval_samples, "sampler_steps": args.sampler_steps}
    return {"name": f"grow {args.size} x{args.steps}", "arms": ["A", "B"], "overrides": overrides, "control": "A",
            "gpus_per_arm": "auto"}  # fmt: skip


def run_ids(url: str, grid_id: int) -> dict[str, int]:
    return {r["arm"]: r["id"] for r in httpx.get(f"{url}/api/grids/{grid_id}", timeout=10).json()["runs"]}


def metrics(url: str, run_id: int) -> list[dict[str, Any]]:
    return httpx.get(f"{url}/api/runs/{run_id}/metrics", timeout=10).json()


def events(url: str, run_id: int) -> list[dict[str, Any]]:
    resp = httpx.get(f"{url}/api/events", params={"run": run_id, "limit": 200}, headers=AUTH, timeout=10)
    resp.raise_for_status()
    return resp.json()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="seed", choices=["tiny", "small", "seed"])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=100, help="checkpoint interval")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--eval-samples", type=int, default=8)
    ap.add_argument("--sampler-steps", type=int, default=10)
    ap.add_argument("--port", type=int, default=8767)
    ap.add_argument("--timeout", type=float, default=480)
    ap.add_argument("--out", type=Path, default=None, help="write the report here")
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="ablate-grow-"))
    lines: list[str] = []

    def say(*text: str) -> None:
        lines.extend(text)
        print(*text, sep="\n", flush=True)

    t0 = time.monotonic()
    try:
        with serving(home, args.port, TOKEN) as url:
            resp = httpx.post(f"{url}/api/grids", json=grid_body(args), headers=AUTH, timeout=60)
            resp.raise_for_status()
            grid_id = resp.json()["id"]
            plan = resp.json().get("plan") or {}
            slots = [f"{s['run']} {s['gpus']} GPU(s) {s['start_h']:.4f}-{s['end_h']:.4f} h"
                     for s in plan.get("slots", [])]
            say(f"`python bench/grow_gpu.py --size {args.size} --steps {args.steps} --every {args.every} "
                f"--batch {args.batch}`", "", "plan at submission: " + ", ".join(slots))
            ids = run_ids(url, grid_id)
            stopped_at = None
            while time.monotonic() - t0 < args.timeout:
                runs = {r["arm"]: r for r in httpx.get(f"{url}/api/grids/{grid_id}", timeout=10).json()["runs"]}
                if stopped_at is None and metrics(url, ids["A"]):
                    httpx.post(f"{url}/api/runs/{ids['B']}/stop", headers=AUTH, timeout=10)
                    stopped_at = time.monotonic() - t0
                    say(f"B stopped by the user at {stopped_at:.1f} s, after A's first checkpoint")
                if all(r["state"] in TERMINAL for r in runs.values()):
                    break
                time.sleep(1)
            say(f"A: {runs['A']['state']}, B: {runs['B']['state']} at {time.monotonic() - t0:.0f} s", "")
            evs = [e for e in events(url, ids["A"]) if "grow" in e["kind"]]  # grow_requested, grown
            say("A's growth events:", "", *[f"- {e['created_at']} {e['kind']}: {e['message']}" for e in reversed(evs)],
                "")
            say("| step | ranks | tokens/s (window) | it/s | wall_time_s | compile_s | resumed_from |",
                "|---|---|---|---|---|---|---|")
            for m in metrics(url, ids["A"]):
                x = m.get("extra") or {}
                say(f"| {m['step']} | {x.get('ranks')} | {(m.get('tokens_per_sec') or 0):,.0f} | "
                    f"{(m.get('iter_per_sec') or 0):.3f} | {m.get('wall_time_s')} | {x.get('compile_s')} | "
                    f"{x.get('resumed_from_step')} |")
            say("", "raw events:", json.dumps(events(url, ids["A"]), default=str))
    finally:
        say(f"wall {time.monotonic() - t0:.0f} s")
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text("\n".join(lines) + "\n")
            shutil.copy(home / "serve.log", args.out.with_suffix(".serve.log"))
            for agent_log in home.rglob("agent.log"):
                shutil.copy(agent_log, args.out.with_suffix(".agent.log"))


if __name__ == "__main__":
    main()
