"""The night planner on a real quad node (issue 48): arms A–D with `gpus_per_arm: "auto"` through
`ablate serve` and REST, a short run of each at seed size, then the 5000-step night the plan projects from
the rates the runs measured.

It starts `ablate serve` as a user would (SQLite, the node's own Ray seeing its GPUs), submits the grid,
prints the plan the submit answer carries (each run's GPUs, start and end, the night and its lower bound),
watches the runs (when each started and ended, on how many GPUs), and reads each run's steady-state rate
(its last checkpoint's window: warm-up, compile and evaluation excluded). From those it projects the
study's night: 5000 steps at the study's batch of 256 per arm, each arm's single-GPU hours from its
measured tokens/s (an arm measured on g GPUs divided by the measured or default scaling), through
`ablate plan --hours ... --scaling ...` on 4 GPUs.

On the GPU machine: `bash bench/quad_node.sh` installs the carried wheels; then
    python3 bench/quad_night.py --steps 160 --every 80 --batch 32 --out $OUT/quad_night.md
Dry run on a CPU machine with logical GPUs:
    PYTHONPATH=. ABLATE_LOGICAL_GPUS=4 python bench/quad_night.py --size tiny --steps 20 --every 10 --batch 8
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quad_node import TOKEN, bench_overrides, intervals, serving, watch  # noqa: E402 - a bench beside it

ARMS = ["A", "B", "C", "D"]
STUDY_STEPS, STUDY_BATCH = 5000, 256
DEFAULT_SCALING = {2: 2.04, 4: 3.98}  # measured on four H100s at steady state (issue 48), until this run says


def grid_body(args: argparse.Namespace) -> dict[str, Any]:
    overrides = {**bench_overrides(args), "repa": {"teacher": "random_standin"}, "precision": {"compile": True}}
    return {"name": f"quad night {args.size} x{args.steps}", "arms": ARMS, "overrides": overrides, "control": "A",
            "gpus_per_arm": "auto"}


def plan_lines(plan: dict[str, Any] | None) -> list[str]:
    if not plan:
        return ["(no plan in the submit answer)"]
    out = ["| run | GPUs | node | start h | end h | hours (1 GPU) | fixed h | source |",
           "|---|---|---|---|---|---|---|---|"]
    for s in plan["slots"]:
        out.append(f"| {s['run']} | {s['gpus']} | {s['node']} | {s['start_h']:.4f} | {s['end_h']:.4f} | "
                   f"{plan['hours'].get(s['arm'], 0):.4f} | {plan.get('fixed_h', {}).get(s['arm'], 0):.4f} | "
                   f"{plan['sources'].get(s['arm'], '-')} |")
    out.append(f"night {plan['night_h']:.4f} h; lower bound {plan['lower_bound_h']:.4f} h ({plan['search']})")
    return out


def measured(url: str, grid_id: int) -> dict[str, dict[str, Any]]:
    """Per arm: its GPUs, its last checkpoint's tokens/s and iter/s (the steady-state window)."""
    grid = httpx.get(f"{url}/api/grids/{grid_id}", timeout=10).json()
    out = {}
    for run in grid["runs"]:
        detail = httpx.get(f"{url}/api/runs/{run['id']}", timeout=10).json()
        rows = httpx.get(f"{url}/api/runs/{run['id']}/metrics", timeout=10).json()
        rows = [m for m in rows if m.get("tokens_per_sec")]
        last = rows[-1] if rows else {}
        out[run["arm"]] = {"gpus": (detail.get("spec") or {}).get("gpus", 1), "state": run["state"],
                           "tokens_per_sec": last.get("tokens_per_sec"), "iter_per_sec": last.get("iter_per_sec"),
                           "step": last.get("step")}  # fmt: skip
    return out


def projected_night(rates: dict[str, dict[str, Any]], tokens_per_image: int, home: Path) -> str:
    """`ablate plan` on 4 GPUs with each arm's single-GPU hours for the study's night from its measured rate."""
    hours = {}
    for arm, r in rates.items():
        if not r["tokens_per_sec"]:
            continue
        one_gpu = r["tokens_per_sec"] / (DEFAULT_SCALING.get(r["gpus"], r["gpus"]) if r["gpus"] > 1 else 1)
        hours[arm] = STUDY_STEPS * STUDY_BATCH * tokens_per_image / one_gpu / 3600
    grid = home / "night.yaml"
    grid.write_text(yaml.safe_dump({"name": "night", "arms": ARMS, "gpus_per_arm": "auto"}))
    given = ",".join(f"{a}={h:.3f}" for a, h in hours.items())
    scaling = ",".join(f"{g}={s}" for g, s in DEFAULT_SCALING.items())
    cmd = [sys.executable, "-m", "orchestrator.cli", "plan", str(grid), "--gpus", "4", "--hours", given,
           "--scaling", scaling]  # fmt: skip
    env = dict(os.environ, ABLATE_DATABASE_URL=f"sqlite:///{home / 'ablate.db'}")  # the served grid's records
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=home, env=env)
    return f"`ablate plan night.yaml --gpus 4 --hours {given} --scaling {scaling}`\n\n{proc.stdout}{proc.stderr}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="seed", choices=["tiny", "small", "seed"])
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--every", type=int, default=80, help="checkpoint interval")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--port", type=int, default=8766)
    ap.add_argument("--timeout", type=float, default=460)
    ap.add_argument("--tokens-per-image", type=int, default=4096, help="seed size: 256 px, patch 4 after the VAE")
    ap.add_argument("--out", type=Path, default=None, help="write the report here")
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="ablate-night-"))
    t0 = time.monotonic()
    lines: list[str] = []

    def say(*text: str) -> None:
        lines.extend(text)
        print(*text, sep="\n", flush=True)

    try:
        with serving(home, args.port, TOKEN) as url:
            resp = httpx.post(f"{url}/api/grids", json=grid_body(args), headers={"Authorization": f"Bearer {TOKEN}"},
                              timeout=60)  # fmt: skip
            resp.raise_for_status()
            answer = resp.json()
            say(f"`python bench/quad_night.py --size {args.size} --steps {args.steps} --every {args.every} "
                f"--batch {args.batch}`, {datetime.now():%Y-%m-%d}", "", "The plan at submission:", "",
                *plan_lines(answer.get("plan")), "")
            timeline, _ = watch(url, answer["id"], args.timeout)
            spans = intervals(timeline)
            rates = measured(url, answer["id"])
            say("| arm | GPUs | state | ran from / to (s) | step | tokens/s (last window) | it/s |",
                "|---|---|---|---|---|---|---|")
            for s in spans.values():
                r = rates[s["arm"]]
                say(f"| {s['arm']} | {r['gpus']} | {r['state']} | {s['start']} / {s['end']} | {r['step']} | "
                    f"{(r['tokens_per_sec'] or 0):,.0f} | {(r['iter_per_sec'] or 0):.3f} |")
            redrawn = httpx.get(f"{url}/api/grids/{answer['id']}", timeout=10).json().get("plan")
            say("", "The plan as last redrawn by the launcher:", "", *plan_lines(redrawn), "",
                "The study's night from these rates:", "", projected_night(rates, args.tokens_per_image, home),
                f"wall {time.monotonic() - t0:.0f} s", "", "timeline:", json.dumps(timeline))
    finally:
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text("\n".join(lines) + "\n")
            shutil.copy(home / "serve.log", args.out.with_suffix(".serve.log"))
            for agent_log in home.rglob("agent.log"):  # the local node agent's stderr (Ray, the workers)
                shutil.copy(agent_log, args.out.with_suffix(".agent.log"))


if __name__ == "__main__":
    main()
