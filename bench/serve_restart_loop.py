"""`ablate serve` start/submit/stop cycles under CPU load: how long each takes to exit once asked to stop.

Each cycle, as tests/orchestrator/test_cli.py::test_serve_submit_restart does it: a fresh SQLite
database and storage dir, `ablate serve` on a free port (it starts its own local Ray), wait for
/healthz, `ablate submit` a 4-arm grid, then SIGINT (Ctrl-C; --signal term sends SIGTERM) and time
until the process has exited. Meanwhile one busy-loop process per core keeps the CPU saturated
(the 2-core CI machine where the hang was seen). A server that has not exited after --hang-s is
dumped with py-spy (itself and every descendant: Ray's gcs_server, raylet, ...), the dumps are
written under --out's directory, and its process tree is killed by pid.

Prints one line per cycle and a summary, writes --out as JSON. Target: no exit slower than 15 s.

    python bench/serve_restart_loop.py --cycles 30 --out docs/bench-results/serve_restart_loop.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.kit.net import free_port  # noqa: E402

GRID = "name: study\narms: [A, B, C, D]\ncontrol: A\n"


def start_load(n: int) -> list[subprocess.Popen[bytes]]:
    """n busy-loop processes (one per core): the 'fresh 2-core machine under CI load' of the issue."""
    code = "while True: pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


def descendants(pid: int) -> list[int]:
    """Every process below pid (from /proc; Ray's gcs_server, raylet, workers, ...), depth first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    stack = list(children.get(pid, []))
    while stack:
        child = stack.pop()
        out.append(child)
        stack.extend(children.get(child, []))
    return out


def cmdline(pid: int) -> str:
    """The command line, or for a zombie (empty cmdline: exited, not yet reaped) its name and state."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "?"
    name, state = stat[stat.index("(") + 1 : stat.rindex(")")], stat.rsplit(")", 1)[1].split()[0]
    return cmd or f"[{name}] state {state}"


def ablate_cmd() -> list[str]:
    exe = shutil.which("ablate")
    return [exe] if exe else [sys.executable, "-c", "from orchestrator.cli import main; main()"]


def dump(pid: int, path: Path, children: bool = True) -> None:
    """py-spy dump of pid (and each descendant) into path: what each thread is blocked in."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    parts = []
    for p in [pid, *(descendants(pid) if children else [])]:
        res = subprocess.run([py_spy, "dump", "--native", "--pid", str(p)], capture_output=True, text=True, timeout=60)
        parts.append(f"===== pid {p}: {cmdline(p)[:300]}\n{res.stdout}{res.stderr}")
    path.write_text("\n".join(parts))


def kill_tree(pid: int) -> None:
    for p in [*reversed(descendants(pid)), pid]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def cycle(i: int, args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    import httpx

    tmp = Path(tempfile.mkdtemp(prefix=f"serve-loop-{i}-"))
    port = free_port()
    env = {
        **os.environ,
        "ABLATE_DATABASE_URL": f"sqlite:///{tmp / 'ablate.db'}",
        "ABLATE_HOME_DIR": str(tmp / "st"),
        "ABLATE_PORT": str(port),
        "ABLATE_OFFLINE": "1",
        "NO_COLOR": "1",
    }
    (tmp / "grid.yaml").write_text(GRID)
    log = open(tmp / "serve.log", "w")  # noqa: SIM115 (closed below)
    t0 = time.monotonic()
    proc = subprocess.Popen([*ablate_cmd(), "serve", "--port", str(port)], env=env, cwd=tmp, stdout=log, stderr=log)
    result: dict[str, Any] = {"cycle": i}
    try:
        while time.monotonic() - t0 < 60:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"serve exited {proc.returncode} before /healthz; see {tmp / 'serve.log'}")
            time.sleep(0.1)
        result["healthy_s"] = round(time.monotonic() - t0, 2)
        if args.settle_s:
            time.sleep(args.settle_s)
        sub = subprocess.run(
            [*ablate_cmd(), "submit", str(tmp / "grid.yaml")], env=env, cwd=tmp, capture_output=True, text=True,
            timeout=120,
        )
        result["submit_rc"] = sub.returncode
        result["since_start_s"] = round(time.monotonic() - t0, 2)
        sig = signal.SIGTERM if args.signal == "term" else signal.SIGINT
        t_stop = time.monotonic()
        proc.send_signal(sig)
        try:
            for k, at in enumerate(args.dump_after):  # where a slow (not yet hung) exit spends its time
                try:
                    proc.wait(timeout=max(0.0, at - (time.monotonic() - t_stop)))
                    break
                except subprocess.TimeoutExpired:
                    dump(proc.pid, out_dir / f"serve_slow_cycle{i}_{k}.txt", children=False)
            proc.wait(timeout=max(0.0, args.hang_s - (time.monotonic() - t_stop)))
            result["exit_s"] = round(time.monotonic() - t_stop, 2)
            result["rc"] = proc.returncode
        except subprocess.TimeoutExpired:
            result["exit_s"] = None
            result["hung"] = True
            path = out_dir / f"serve_hang_cycle{i}.txt"
            dump(proc.pid, path)
            result["dump"] = str(path)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()
        log.close()
        text = (tmp / "serve.log").read_text()
        result["traceback"] = "Traceback" in text
        # Launcher.stop found its thread still inside ray.init (see docs/benchmarks.md, "The fix").
        result["waited_for_ray_init"] = "waiting for Ray to finish starting" in text
        result["exited_under_ray_init"] = "exiting without it" in text
        if result.get("hung") or result["traceback"] or args.keep:
            result["log"] = str(tmp / "serve.log")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=30)
    ap.add_argument("--load", type=int, default=os.cpu_count() or 2, help="busy-loop processes (default: one per core)")
    ap.add_argument("--signal", choices=["int", "term", "both"], default="both", help="both: alternate per cycle")
    ap.add_argument("--hang-s", type=float, default=60.0, help="a server not gone after this is dumped and killed")
    ap.add_argument("--dump-after", type=float, nargs="*", default=[], help="py-spy dump at these s after the signal")
    ap.add_argument("--settle-s", type=float, default=0.0, help="wait after /healthz before submitting")
    ap.add_argument("--keep", action="store_true", help="keep every cycle's temp dir")
    ap.add_argument("--out", type=Path, default=Path("serve_restart_loop.json"))
    args = ap.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # A shell's background job (nohup ... &) ignores SIGINT and its children inherit that: give the
    # servers Ctrl-C's default (KeyboardInterrupt after uvicorn's shutdown), as in a terminal or pytest.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    load_before = os.getloadavg()[0]  # other users of the machine add to our busy loops
    load = start_load(args.load)
    results = []
    try:
        for i in range(args.cycles):
            sig = args.signal if args.signal != "both" else ("int", "term")[i % 2]
            res = cycle(i, argparse.Namespace(**{**vars(args), "signal": sig}), args.out.parent)
            res["signal"] = sig
            results.append(res)
            print(json.dumps(res), flush=True)
    finally:
        for p in load:
            p.kill()
            p.wait()
    exits = [r["exit_s"] for r in results if r.get("exit_s") is not None]
    summary = {
        "cycles": len(results),
        "load_processes": args.load,
        "cpus": os.cpu_count(),
        "loadavg_1min_before_after": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "hung": sum(1 for r in results if r.get("hung")),
        "tracebacks": sum(1 for r in results if r["traceback"]),
        "submit_failures": sum(1 for r in results if r.get("submit_rc") != 0),
        "exit_s_median": statistics.median(exits) if exits else None,
        "exit_s_max": max(exits) if exits else None,
        "over_15s": sum(1 for e in exits if e > 15),
        "waited_for_ray_init": sum(1 for r in results if r["waited_for_ray_init"]),
        "exited_under_ray_init": sum(1 for r in results if r["exited_under_ray_init"]),
    }
    print(json.dumps(summary), flush=True)
    args.out.write_text(json.dumps({"summary": summary, "cycles": results}, indent=1))


if __name__ == "__main__":
    main()
