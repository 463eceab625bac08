"""A deciding grid against a fixed 3-seed grid on one machine, through `ablate serve` and REST (issue 50).

Arms A, C and A with its lr / 10 (an inline arm: parent A, `schedule.lr` 3e-5), the same overrides in
both grids. Grid 1 carries `decide` (alpha, min_seeds, max_seeds as given) in place of `seeds`; grid 2
carries `seeds: 3`. It starts `ablate serve` as a user would (SQLite, the node's own Ray seeing its GPUs),
submits both with a token, watches them (the deciding grid until its final look, the fixed one until every
run ended), and writes per grid:
- the submit answer's cost (the deciding grid's worst case and expected GPU-hours);
- each look of the deciding grid (from the `decision_looks` table: each comparison's difference, the look's
  repeated confidence interval, decision, alpha spent, k, n, and the work queued for it);
- each comparison on the decided metric as the report JSON gives it (decision, look, alpha spent, k, n;
  for the fixed grid its 95% crossed interval) and `ablate status` of the deciding grid;
- GPU-hours two ways: as recorded (each run's last `gpu_hours` record, which the trainer counts from its
  own start, plus each evaluation's measured `gpu_seconds`) and as held (each run's started_at to
  finished_at times its GPUs, plus the evaluations' gpu_seconds), and the grid's wall time (submission to
  its last run's end, or to the final look for the deciding grid).

`--order sequential` (default) runs the deciding grid to its final look, then the fixed grid, so each has
the machine to itself; `together` submits both at once (wall times then overlap; GPU-hours do not).
`--borrow` (with `--order fixed-first`): the deciding grid names the fixed grid in `decide.borrow_from`, so
each arm's seed variance is borrowed from it (results/deciding/borrowed.py) and one seed can decide (`--min-seeds
1`). The fixed grid then stands for an earlier study of the same arms, and the deciding grid for the next
one: its GPU-hours against what a fixed 3-seed run of it would cost (the fixed grid's).

On the GPU machine: `bash bench/decide_gpu.sh [args]` (the carried wheels and Ray, then this script).
`--distribution-samples N` (issue 58): the fixed grid's runs also score CMMD (eval.distribution) on N samples at
their last checkpoint; its table follows, and the GPU-hours are compared with and without those passes' seconds.

`--order fixed-only` (issue 58 item 6, second half): only the fixed grid is submitted and watched (no deciding
grid). `--lr-factor F` (default 0.1): the inline arm is A with lr x F, named "A-lr10" for F = 0.1 (1/F where
that is a whole number) and "A-lrx10" for F = 10. `--arms` (default A,C,lr): which arms both grids hold, "lr"
standing for the inline arm; A (the control) must be among them. So a known-worse arm told apart on CMMD:
    bash bench/decide_gpu.sh --order fixed-only --arms A,lr --lr-factor 10 --distribution-samples 512 ...
(6 runs at 3 seeds: A and A-lrx10.)

Dry run on a CPU machine with logical GPUs (about 7 minutes on 2 shared cores):
    PYTHONPATH=. ABLATE_LOGICAL_GPUS=4 python bench/decide_gpu.py --size tiny --steps 20 --every 10 --batch 4 \
        --num-images 64 --held-out 64 --num-samples 16 --sampler-steps 2 --distribution-samples 16
and of the CMMD grid (under a minute): the same with `--order fixed-only --arms A,lr --lr-factor 10`.
"""

from __future__ import annotations

import argparse
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quad_node import TOKEN, serving  # noqa: E402 - a bench beside it

from model.flow_headline import HEADLINE  # noqa: E402
from orchestrator.db.models import Grid  # noqa: E402
from orchestrator.db.session import session_scope  # noqa: E402
from orchestrator.results.deciding.decisions import grid_looks, look_comparisons  # noqa: E402

A_LR = 3.0e-4  # arms/A.yaml
TERMINAL = {"completed", "stopped", "failed"}
DISTRIBUTION_LAST_ONLY = 10_000  # eval.distribution.every: a pass at the last checkpoint only
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def lr_arm(factor: float) -> dict[str, Any]:
    """A with its lr x factor, inline: "A-lr10" (lr / 10) for 0.1, as issue 50's records name it, where 1 / factor
    is a whole number; else "A-lrx10" (lr x 10), "A-lrx0.3"."""
    inverse = round(1 / factor)
    if factor < 1 and abs(1 / factor - inverse) < 1e-9:
        return {"parent": "A", "name": f"A-lr{inverse}", "schedule": {"lr": A_LR / inverse}}
    return {"parent": "A", "name": f"A-lrx{factor:g}", "schedule": {"lr": A_LR * factor}}


def arms(args: argparse.Namespace) -> list[Any]:
    """The grids' arms from --arms: names from arms/, "lr" standing for the inline arm (lr x --lr-factor)."""
    return [lr_arm(args.lr_factor) if a == "lr" else a for a in args.arms]


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Shapes data, the schedule from the flags, the labelled stand-ins (no pretrained weights on the node).
    The training records evaluate `num_samples` of the `held_out` images, so the decider can ask for more."""
    return {
        "model": {"size": args.size},
        "data": {"dataset": "shapes", "num_images": args.num_images, "held_out": args.held_out},
        "schedule": {"steps": args.steps, "batch_size": args.batch, "warmup_steps": max(1, args.steps // 10),
                     "checkpoint_every": args.every, "ema": {"warmup_steps": max(1, args.steps // 5)}},
        "eval": {"num_samples": args.num_samples, "sampler_steps": args.sampler_steps,
                 "lpips_backbone": "random_standin"},
        "repa": {"teacher": "random_standin"},
        "precision": {"compile": args.compile},
    }  # fmt: skip


def bodies(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    decide = {"alpha": args.alpha, "min_seeds": args.min_seeds, "max_seeds": args.max_seeds,
              "max_images": args.max_images, "margin": {HEADLINE: 0.0}}  # fmt: skip
    if args.max_gpu_hours is not None:  # else the submit's worst case, stored with the grid
        decide["max_gpu_hours"] = args.max_gpu_hours
    common = {"arms": arms(args), "overrides": overrides(args), "control": "A"}
    fixed = {**common, "overrides": overrides(args)}
    if args.distribution_samples:  # issue 58: CMMD on the fixed grid's last checkpoints (its passes timed apart)
        fixed["overrides"]["eval"]["distribution"] = {
            "metrics": ["cmmd"], "samples": args.distribution_samples, "every": DISTRIBUTION_LAST_ONLY,
            "sampler_steps": args.sampler_steps}  # fmt: skip
    return {"decide": {"name": f"decide {args.size} x{args.steps}", **common, "decide": decide},
            "fixed": {"name": f"fixed3 {args.size} x{args.steps}", **fixed, "seeds": args.fixed_seeds}}  # fmt: skip


def get(url: str, path: str, **params: Any) -> Any:
    resp = httpx.get(f"{url}{path}", params=params, headers=AUTH, timeout=60)
    resp.raise_for_status()
    return resp.json()


def grid_done(url: str, gid: int, deciding: bool) -> bool:
    """Every run ended; a deciding grid also took its final look (which waits for its evaluations)."""
    grid = get(url, f"/api/grids/{gid}")
    if not grid["runs"] or any(r["state"] not in TERMINAL for r in grid["runs"]):
        return False
    return not deciding or any(e["data"].get("final") for e in get(url, "/api/events", grid=gid, kind="decide.look"))


def watch(url: str, gids: dict[str, int], timeout_s: float, t0: float) -> bool:
    """Poll every 2 s until every grid in `gids` is done (True) or `timeout_s` since t0 passed (False); print
    run states and decision events as they come."""
    seen_state: dict[int, str] = {}
    seen_events: set[int] = set()
    while True:
        for label, gid in gids.items():
            for r in get(url, f"/api/grids/{gid}")["runs"]:
                if seen_state.get(r["id"]) != r["state"]:
                    seen_state[r["id"]] = r["state"]
                    stamp = f"[{time.monotonic() - t0:6.1f}s] {label}"
                    print(f"{stamp} {r['arm']} s{r['seed']} -> {r['state']}", flush=True)
            for e in reversed(get(url, "/api/events", grid=gid, kind="decide.")):
                if e["id"] not in seen_events:
                    seen_events.add(e["id"])
                    print(f"[{time.monotonic() - t0:6.1f}s] {label} {e['kind']}: {e['message']}", flush=True)
        if all(grid_done(url, gid, label == "decide") for label, gid in gids.items()):
            return True
        if time.monotonic() - t0 > timeout_s:
            return False
        time.sleep(2.0)


def ts(s: str | None) -> float | None:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp() if s else None


def costs(url: str, gid: int) -> dict[str, Any]:
    """The grid's GPU-hours, recorded and held, its runs per arm, and its wall time in seconds."""
    grid = get(url, f"/api/grids/{gid}")
    recorded = held = dist_h = 0.0
    seeds: dict[str, int] = {}
    ends = []
    created = ts(grid["created_at"]) or 0.0
    rows_out = []
    for r in grid["runs"]:
        detail = get(url, f"/api/runs/{r['id']}")
        gpus = detail["spec"].get("gpus") or 1
        rows = get(url, f"/api/runs/{r['id']}/metrics")
        run_h = max((m["gpu_hours"] for m in rows if m.get("gpu_hours") is not None), default=0.0)
        recorded += run_h
        dist_h += sum((m.get("extra") or {}).get("distribution_seconds") or 0.0 for m in rows) / 3600
        start, end = ts(r["started_at"]), ts(r["finished_at"])
        if start and end:
            held += (end - start) / 3600 * gpus
            ends.append(end)
        it_s = [m["iter_per_sec"] for m in rows if m.get("iter_per_sec")]
        rows_out.append(f"{r['arm']} s{r['seed']} {r['state']} {num(start and start - created, '.0f')}-"
                        f"{num(end and end - created, '.0f')} s, {run_h * 3600:.0f} GPU-s recorded, "
                        f"{num(it_s[-1] if it_s else None, '.1f')} it/s")  # fmt: skip
        seeds[r["arm"]] = seeds.get(r["arm"], 0) + 1
    evaluations = get(url, f"/api/grids/{gid}/evaluations")
    eval_h = sum(e["gpu_seconds"] or 0.0 for e in evaluations) / 3600
    ends += [t for e in evaluations if (t := ts(e["finished_at"]))]
    looks = [e for e in get(url, "/api/events", grid=gid, kind="decide.look") if e["data"].get("final")]
    end = ts(looks[0]["time"]) if looks else max(ends, default=None)
    return {"recorded_h": recorded + eval_h, "held_h": held + eval_h, "eval_h": eval_h, "dist_h": dist_h,
            "runs": len(grid["runs"]),
            "seeds": seeds, "evaluations": [(e["images"], e["state"]) for e in evaluations],
            "wall_s": (end - created) if end and created else None, "rows": rows_out}  # fmt: skip


def headline_effects(url: str, gid: int, metric: str = HEADLINE) -> list[dict[str, Any]]:
    return [e for e in get(url, f"/api/grids/{gid}/report.json")["effects"] if e["metric"] == metric]


def num(x: float | None, f: str = ".4f") -> str:
    return "-" if x is None else format(x, f)


def look_lines(database_url: str, gid: int) -> list[str]:
    """Each look of the deciding grid, from its stored looks (the repeated confidence interval is there)."""
    out = ["| look | comparison | diff | repeated CI | decision | alpha spent | k | n | action |",
           "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    with session_scope(database_url) as session:
        for look in grid_looks(session, gid):
            for c in look_comparisons(look):
                out.append(f"| {look.wave + 1} | {c.arm} - {c.other_arm} ({c.against}) | {c.diff:+.4f} | "
                           f"[{num(c.low, '+.4f')}, {num(c.high, '+.4f')}] | {c.decision} | {c.alpha_spent:.4g} | "
                           f"{c.k} | {c.n or '-'} | {c.action or '-'} |")  # fmt: skip
            for a in look.actions:
                out.append(f"| {look.wave + 1} | queued: {a['words']} | | | | | | | |")
    return out


def budget_lines(database_url: str, gid: int, spent_h: float) -> list[str]:
    """The deciding grid's stored caps (decide.max_gpu_hours, max_looks, max_evaluations) against its spend, so
    a reader sees whether a cap, not the statistics, closed it."""
    with session_scope(database_url) as session:
        decide = session.get(Grid, gid).decide or {}
    cap = decide.get("max_gpu_hours")
    room = f"{spent_h / cap:.2f} of it spent" if cap else "no cap"
    return [f"The deciding grid's stored budget: max_gpu_hours {num(cap, '.4f')} ({room}), max_looks "
            f"{decide.get('max_looks')}, max_evaluations {decide.get('max_evaluations')}"]  # fmt: skip


def comparison_table(decided: list[dict[str, Any]], fixed: list[dict[str, Any]]) -> list[str]:
    key = lambda e: (e["arm"], e["other_arm"], e["against"])  # noqa: E731
    fixed_by = {key(e): e for e in fixed}
    out = [f"| comparison ({HEADLINE}) | decided: decision | look | alpha spent | k | n | decided: diff [95% report "
           "interval] | fixed: diff [95% crossed interval] | fixed: k | fixed: n | fixed: reading |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for e in decided:
        f = fixed_by.get(key(e), {})
        out.append(f"| {e['arm']} - {e['other_arm']} ({e['against']}) | {e.get('decision') or '-'} | "
                   f"{e.get('look') or '-'} | {num(e.get('alpha_spent'), '.4g')} | {e['k']} | {e.get('n') or '-'} | "
                   f"{e['diff']:+.4f} [{num(e['low'], '+.4f')}, {num(e['high'], '+.4f')}] | "
                   f"{num(f.get('diff'), '+.4f')} [{num(f.get('low'), '+.4f')}, {num(f.get('high'), '+.4f')}] | "
                   f"{f.get('k', '-')} | {f.get('n') or '-'} | {f.get('reading', '-')} |")  # fmt: skip
    return out


def effect_table(effects: list[dict[str, Any]]) -> list[str]:
    """One grid's comparisons on one metric as the report JSON gives them (a stand-in's marked descriptive)."""
    return ["| comparison | diff [95% interval] | k | n | per seed | seed SD | eval SE | reading | extractor |",
            "|---|---|---|---|---|---|---|---|---|",
            *(f"| {e['arm']} - {e['other_arm']} | {e['diff']:+.4f} [{num(e['low'], '+.4f')}, "
              f"{num(e['high'], '+.4f')}] | {e['k']} | {e.get('n') or '-'} | "
              f"{' '.join(format(d['diff'], '+.4f') for d in e.get('per_seed') or []) or '-'} | "
              f"{num(e.get('seed_sd'))} | {num(e.get('eval_se'))} | {e.get('reading', '-')} | "
              f"{e.get('extractor') or '-'}{' (stand-in: descriptive)' if e.get('standin') else ''} |"
              for e in effects)]  # fmt: skip


def ablate_status(url: str, gid: int) -> str:
    """`ablate status GID` as a user runs it: through the server's REST API (ABLATE_URL), with its token."""
    env = dict(os.environ, ABLATE_URL=url, ABLATE_API_TOKEN=TOKEN, COLUMNS="160")
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "status", str(gid)], capture_output=True,
                          text=True, env=env, timeout=120)  # fmt: skip
    return proc.stdout + proc.stderr


def run(args: argparse.Namespace, home: Path, say: Any) -> None:
    database_url = f"sqlite:///{home / 'ablate.db'}"
    t0 = time.monotonic()
    with serving(home, args.port, TOKEN) as url:
        say(f"controller healthy after {time.monotonic() - t0:.1f} s", "")
        answers: dict[str, dict[str, Any]] = {}
        order = {"sequential": [["decide"], ["fixed"]], "together": [["decide", "fixed"]],
                 "fixed-first": [["fixed"], ["decide"]], "fixed-only": [["fixed"]]}[args.order]  # fmt: skip
        done: dict[str, bool] = {}
        for batch in order:
            for label in batch:
                body = bodies(args)[label]
                if label == "decide" and args.borrow:  # the fixed grid ran first: its arms lend their seed variance
                    body["decide"]["borrow_from"] = [answers["fixed"]["id"]]
                left = args.timeout - (time.monotonic() - t0)
                if label == "fixed" and args.distribution_samples and left < args.distribution_min_left:
                    body["overrides"]["eval"].pop("distribution", None)  # the fixed grid first: no time for passes
                    say(f"fixed grid submitted without eval.distribution: {left:.0f} s left, under "
                        f"--distribution-min-left {args.distribution_min_left:.0f}", "")  # fmt: skip
                resp = httpx.post(f"{url}/api/grids", json=body, headers=AUTH, timeout=60)
                resp.raise_for_status()
                answers[label] = resp.json()
                print(f"[{time.monotonic() - t0:6.1f}s] submitted {label}: {answers[label]['cost']}", flush=True)
            finished = watch(url, {label: answers[label]["id"] for label in batch}, args.timeout, t0)
            done.update(dict.fromkeys(batch, finished))
            if not finished:
                break  # out of time: report what there is
        report(url, database_url, answers, done, say)


def report(url: str, database_url: str, answers: dict[str, dict[str, Any]], done: dict[str, bool], say: Any) -> None:
    gids = {label: a["id"] for label, a in answers.items()}
    c = {label: costs(url, gid) for label, gid in gids.items()}
    effects = {label: headline_effects(url, gid) for label, gid in gids.items()}
    say("What each submit answer said:", "")
    for label, a in answers.items():
        extra = (f" (worst case {num(a.get('worst_case_gpu_hours'), '.4f')} GPU-h, expected "
                 f"{num(a.get('expected_gpu_hours'), '.4f')} GPU-h)") if label == "decide" else ""  # fmt: skip
        say(f"- {label} grid {a['id']}: {a['cost']}{extra}")
    if "decide" in gids:
        say("", *budget_lines(database_url, gids["decide"], c["decide"]["recorded_h"]))
    say("", "| grid | done | runs (per arm) | evaluations (images, state) | GPU-h recorded | GPU-h held | of which "
        "evaluations | of which distribution passes | wall s |", "|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    for label, x in c.items():
        say(f"| {label} ({gids[label]}) | {'yes' if done[label] else 'NO (out of time)'} | {x['runs']} "
            f"({', '.join(f'{a} {n}' for a, n in x['seeds'].items())}) | {x['evaluations'] or '-'} | "
            f"{x['recorded_h']:.4f} | {x['held_h']:.4f} | {x['eval_h']:.4f} | {x['dist_h']:.4f} | "
            f"{num(x['wall_s'], '.0f')} |")  # fmt: skip
    if len(c) == 2:
        d, f = c["decide"], c["fixed"]
        ratio = lambda k: f"{d[k] / f[k]:.3f}" if d[k] and f[k] else "-"  # noqa: E731
        say("", f"decided / fixed: GPU-h recorded {ratio('recorded_h')}, held {ratio('held_h')}, "
            f"wall {ratio('wall_s')}")  # fmt: skip
        if f["dist_h"]:  # the fixed grid's distribution passes are issue 58's, not deciding's: compared without
            less = lambda k: (f"{(d[k] - d['dist_h']) / (f[k] - f['dist_h']):.3f}"  # noqa: E731
                              if f[k] > f["dist_h"] else "-")  # fmt: skip
            say("", f"without the distribution passes' seconds: GPU-h recorded {less('recorded_h')}, held "
                f"{less('held_h')}")  # fmt: skip
    for label, x in c.items():
        say("", f"{label} runs (from the grid's submission; GPU-s as the trainer recorded them):", "",
            *(f"- {row}" for row in x["rows"]))  # fmt: skip
    if "decide" in gids:
        decided = [e for e in effects["decide"] if e.get("decision")] or effects.get("fixed", [])
        say("", "Each comparison on the decided metric (report JSON; the fixed grid's own 95% crossed interval):", "",
            *comparison_table(decided, effects.get("fixed", [])), "")  # fmt: skip
    else:  # --order fixed-only
        say("", f"The fixed grid's {HEADLINE} (report JSON; its 95% crossed interval):", "",
            *effect_table(effects.get("fixed", [])), "")  # fmt: skip
    cmmd = headline_effects(url, gids["fixed"], "cmmd") if "fixed" in gids else []
    if cmmd:
        say("The fixed grid's CMMD (x1000, its last checkpoints; report JSON):", "", *effect_table(cmmd), "")
    if "decide" in gids:
        say("The deciding grid's looks (decision_looks table):", "", *look_lines(database_url, gids["decide"]), "",
            "`ablate status` of the deciding grid:", "", "```", ablate_status(url, gids["decide"]).rstrip(),
            "```")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="small", choices=["tiny", "small", "seed"])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=100, help="checkpoint interval")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--num-images", type=int, default=4096)
    ap.add_argument("--held-out", type=int, default=256, help="the held-out split an evaluation may reach")
    ap.add_argument("--num-samples", type=int, default=64, help="held-out images the training records evaluate")
    ap.add_argument("--sampler-steps", type=int, default=20)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--min-seeds", type=int, default=2)
    ap.add_argument("--max-seeds", type=int, default=3)
    ap.add_argument("--max-images", type=int, default=None)
    ap.add_argument(
        "--max-gpu-hours",
        type=float,
        default=None,
        help="decide.max_gpu_hours (default: the product's, the worst case the submit projects)",
    )
    ap.add_argument("--fixed-seeds", type=int, default=3)
    ap.add_argument(
        "--distribution-samples",
        type=int,
        default=0,
        help="issue 58: the fixed grid's runs score CMMD on this many samples at their last checkpoint",
    )
    ap.add_argument(
        "--distribution-min-left",
        type=float,
        default=0.0,
        help="... only where this many seconds of --timeout are left when the fixed grid is submitted",
    )
    ap.add_argument(
        "--order",
        default="sequential",
        choices=["sequential", "fixed-first", "together", "fixed-only"],
        help="fixed-only: the fixed grid alone (no deciding grid)",
    )
    ap.add_argument("--lr-factor", type=float, default=0.1, help='the inline arm ("lr" in --arms): A with lr x this')
    ap.add_argument(
        "--arms",
        type=lambda s: [a.strip() for a in s.split(",") if a.strip()],
        default=["A", "C", "lr"],
        help='comma-separated: arm names from arms/, "lr" for the inline arm; A (the control) among them',
    )
    ap.add_argument("--borrow", action="store_true", help="the deciding grid borrows the fixed grid's seed variances")
    ap.add_argument("--port", type=int, default=8767)
    ap.add_argument("--timeout", type=float, default=480, help="seconds from the controller's start")
    ap.add_argument("--out", type=Path, default=None, help="write the report here")
    args = ap.parse_args()
    if "A" not in args.arms or len(args.arms) < 2 or len(set(args.arms)) != len(args.arms):
        ap.error("--arms needs A (the control) and at least one other arm, each once")
    if args.lr_factor <= 0 or args.lr_factor == 1:
        ap.error("--lr-factor must be positive and not 1")
    if args.borrow and args.order != "fixed-first":
        ap.error("--borrow needs --order fixed-first: the deciding grid borrows from the fixed grid, run first")
    home = Path(tempfile.mkdtemp(prefix="ablate-decide-"))
    lines: list[str] = [f"`python bench/decide_gpu.py {' '.join(sys.argv[1:])}`, {datetime.now():%Y-%m-%d %H:%M}", ""]

    def say(*text: str) -> None:
        lines.extend(text)
        print(*text, sep="\n", flush=True)

    t0 = time.monotonic()
    try:
        run(args, home, say)
    finally:
        say("", f"wall {time.monotonic() - t0:.0f} s")
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text("\n".join(lines) + "\n")
            shutil.copy(home / "serve.log", args.out.with_suffix(".serve.log"))


if __name__ == "__main__":
    main()
