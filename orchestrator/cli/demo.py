"""`ablate demo`: the whole job in one command on embedded defaults.

SQLite under the home dir, a local Ray with 5 logical GPUs, the controller (API + dashboard +
launcher) in this process, the arms of arms/demo.yaml (A-D and one with a learning rate too high,
which the detector stops) at tiny size on procedural shapes; a live table while they train, a
per-arm summary at the end.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from arms import ARMS_DIR
from model.spec import STANDIN
from orchestrator.cli import CLIError, app, free_port
from orchestrator.cli.live_view import WrappedAtWidth, live_view
from orchestrator.cli.tables import Column, print_table
from orchestrator.cli.tables import build as build_table
from orchestrator.numbers import number
from orchestrator.settings import Settings, load_settings
from orchestrator.vocabulary import DETECTOR_STOPS, TERMINAL_STATES, RunDecision, RunState


def demo_console(**options: Any) -> Console:
    """The demo's console: on a terminal its lines wrap between words at the terminal's width (left to the
    terminal, they broke mid-word); into a file or a pipe each line stays whole, at no assumed width."""
    out = Console(**options)
    out.soft_wrap = not out.is_terminal
    return out


console = demo_console()
DEMO_GRID = ARMS_DIR / "demo.yaml"
DEMO_GPUS = 5  # one per arm of arms/demo.yaml, so the broken arm trains beside the others


def demo_settings(base: Settings) -> Settings:
    """The demo's settings: its own SQLite DB unless ABLATE_DATABASE_URL is set, 5 logical GPUs on a local Ray."""
    update: dict[str, Any] = {}
    if "ABLATE_DATABASE_URL" not in os.environ:
        update["database_url"] = f"sqlite:///{(base.home_dir / 'demo.db').resolve()}"
    if not base.ray_address and base.logical_gpus == 0:
        update["logical_gpus"] = DEMO_GPUS
    if base.worker_threads == 0:
        update["worker_threads"] = 1  # four arms share the cores: one intra-op thread each
    return base.model_copy(update=update)


def demo_lpips(settings: Settings) -> tuple[str, str]:
    """(eval.lpips_backbone, a line saying which) for the demo: the real AlexNet trunk when
    ABLATE_LPIPS_WEIGHTS names it, torchvision's cache has it or it can be downloaded there; else,
    offline, the labelled random stand-in (a demo must run anywhere; `ablate train` errors instead)."""
    if settings.lpips_weights:
        return "alexnet", f"LPIPS: AlexNet backbone from {settings.lpips_weights} (ABLATE_LPIPS_WEIGHTS)"
    from model.perceptual import WEIGHTS_ENV, LPIPSWeightsError, ensure_alexnet_weights

    try:
        path = ensure_alexnet_weights()
    except LPIPSWeightsError as exc:
        return STANDIN, (
            f"[yellow]LPIPS: random stand-in backbone (metrics labelled '{STANDIN}'), because {exc.reason}; "
            f"for real LPIPS set {WEIGHTS_ENV}=alexnet.pth[/yellow]"
        )
    return "alexnet", f"LPIPS: AlexNet backbone from {path}"


def demo_grid(lpips_backbone: str = STANDIN) -> dict[str, Any]:
    """arms/demo.yaml, named with the time, LPIPS on the given backbone."""
    body = yaml.safe_load(DEMO_GRID.read_text())
    body["name"] = f"{body['name']} {time.strftime('%Y-%m-%d %H:%M:%S')}"
    body["overrides"].setdefault("eval", {})["lpips_backbone"] = lpips_backbone
    # The detector's "auto": recon LPIPS with real weights, the held-out flow loss on the stand-in (whose
    # LPIPS cannot tell arms apart); the tables lead with whichever it judges. The broken arm stops on its
    # NaN loss either way.
    return body


def _retire_leftovers(settings: Settings) -> None:
    """Runs a killed demo left queued or running in the demo DB would compete for the GPUs: stop them."""
    from sqlalchemy import select

    from orchestrator.db.models import Event, Run, utcnow
    from orchestrator.db.session import session_scope

    with session_scope(settings.database_url) as session:
        for run in session.scalars(select(Run).where(Run.state.not_in(TERMINAL_STATES))).all():
            run.state, run.finished_at = RunState.stopped, utcnow()
            run.decision, run.decision_reason = RunDecision.USER, "left over from an interrupted demo"
            session.add(Event(run_id=run.id, grid_id=run.grid_id, kind="stopped", message=run.decision_reason))


def _rows(settings: Settings, grid_id: int) -> list[dict[str, Any]]:
    """Per run: arm, state, GPU, latest and best metrics (best with its SE and step), the detector's
    stop (decision, step, reason, the best checkpoint kept, device-hours saved)."""
    from sqlalchemy import select

    from model.spec import ArmSpec
    from orchestrator.api.schemas import RunSummary
    from orchestrator.db.models import Metric, Run
    from orchestrator.db.session import session_scope
    from orchestrator.results.reports.effects import METRIC_WORDS
    from orchestrator.results.reports.stats import value_of
    from orchestrator.runs.detector import projected_hours_saved, resolve_policy

    out = []
    with session_scope(settings.database_url) as session:
        for run in session.scalars(select(Run).where(Run.grid_id == grid_id).order_by(Run.position)).all():
            metrics = session.scalars(select(Metric).where(Metric.run_id == run.id).order_by(Metric.step)).all()
            latest = metrics[-1] if metrics else None
            best = next((m for m in metrics if m.step == run.best_step), None)
            rates = [m.iter_per_sec for m in metrics if m.iter_per_sec]
            steps = (run.spec.get("schedule") or {}).get("steps")
            stopped_by_detector = run.state == RunState.stopped and run.decision in DETECTOR_STOPS
            at_stop = next((m for m in metrics if m.step == run.decision_step), None)
            saved = None
            if stopped_by_detector and at_stop is not None and at_stop.wall_time_s is not None:
                # one worker holds one device for its wall time: its device-hours
                saved = projected_hours_saved(steps, run.decision_step, at_stop.wall_time_s / 3600)
            row = RunSummary.from_row(run, latest).model_dump()  # arm, state, decision, best_step, ...
            spec = ArmSpec.model_validate(run.spec)
            # The spec says the backbone before the first checkpoint does: the judged metric (the live table's
            # header) is the same from the first refresh on.
            standin = spec.eval.lpips_backbone == STANDIN or any(m.lpips_backbone == STANDIN for m in metrics)
            judge = resolve_policy(spec.detector, standin).metric
            row.update(
                judge=judge,
                judge_words=METRIC_WORDS.get(judge, judge),
                detector_stop=stopped_by_detector,
                reason=run.decision_reason or run.error,
                gpu=run.gpu_index,
                steps=steps,
                step=row["latest_step"],
                first=value_of(metrics[0], judge) if metrics else None,
                first_step=metrics[0].step if metrics else None,
                final=row[judge],
                best=run.best_value,
                best_se=value_of(best, f"{judge}_se") if best else None,
                hours_saved=saved,
                iter_s=sum(rates) / len(rates) if rates else None,  # mean over checkpoints
                backbone=row["lpips_backbone"],
            )
            out.append(row)
    return out


def _saved(hours: float | None) -> str:
    """Device-hours saved, with the seconds (a tiny demo arm saves seconds, a seed-size arm hours)."""
    return "-" if hours is None else f"{hours:.4f} ({hours * 3600:.0f} s)"


def _shown_path(path: str | None) -> str | None:
    """A checkpoint's path relative to the working directory where it lies under it (short enough for a line
    of an 80-column terminal), else as stored."""
    if not path:
        return path
    with contextlib.suppress(ValueError):
        return str(Path(path).relative_to(Path.cwd()))
    return path


def _stop_lines(rows: list[dict[str, Any]]) -> list[Text]:
    """One line per arm the detector stopped: decision, step, the best checkpoint kept, the reason (plain
    text: a reason's brackets are not markup)."""
    return [
        Text(f"{r['arm']} stopped by the detector at step {r['decision_step']} ({r['decision']}); kept its best "
             f"checkpoint, step {r['best_step']}: {_shown_path(r['best_checkpoint'])}\n  reason: {r['reason']}")
        for r in rows
        if r["detector_stop"]
    ]


# The widest a live cell's number can be: a judged metric (LPIPS, the flow loss) below 10 in magnitude, an
# arm's iterations a second below 1000, a stop's savings below 10,000 s. A wider cell re-fits the table.
WIDEST_METRIC = -9.999
WIDEST_ITER_S = 999.9
WIDEST_SAVED_H = 9999 / 3600


def widest_progress_row(rows: list[dict[str, Any]]) -> list[str]:
    """The widest content each live column can take over the whole demo, from what is known at submit (the
    arms' names, their steps): the table is fitted to it once, so its header stays the same while cells grow
    ("queued" to "stopped (diverged @150)", "-" to "0.0056 (20 s)")."""
    steps = max((r["steps"] or 0 for r in rows), default=0)
    stops = [f"{RunState.stopped} ({d} @{steps})" for d in DETECTOR_STOPS]
    states = [*(str(s) for s in RunState), *stops]
    metric = number(WIDEST_METRIC, ".3f")
    return [
        max((r["arm"] for r in rows), key=len, default=""),
        max(states, key=len),
        "99",
        f"{steps}/{steps}",
        metric,
        f"{metric} @{steps}",
        number(WIDEST_ITER_S, ".1f"),
        _saved(WIDEST_SAVED_H),
    ]


def _progress_table(
    rows: list[dict[str, Any]], elapsed: float, url: str, device: str = "CPU", width: int | None = None
) -> Group:
    """The live table, fitted to `width` (the terminal's) by hiding whole columns, chosen for the widest
    content they can take (the same columns on every refresh); None: whole."""
    columns = [
        Column("arm"),
        Column("state"),
        Column("GPU", priority=3, justify="right"),
        Column("step", priority=2, justify="right"),
        Column(judged(rows), priority=1, short="judged", justify="right"),
        Column("best", justify="right"),
        Column("iter/s", priority=4, justify="right"),
        Column(f"{device}-h saved", priority=5, short="saved", justify="right"),
    ]
    cells = []
    for r in rows:
        state = r["state"] + (f" ({r['decision']} @{r['decision_step']})" if r["detector_stop"] else "")
        cells.append(
            [
                r["arm"],
                state,
                r["gpu"] or "-",
                f"{r['step'] or 0}/{r['steps']}",
                number(r["final"], ".3f"),
                f"{number(r['best'], '.3f')} @{r['best_step']}" if r["best"] is not None else "-",
                number(r["iter_s"], ".1f"),
                _saved(r["hours_saved"]),
            ]
        )
    title = f"ablate demo: {elapsed:4.0f} s   dashboard {url}"
    table, _ = build_table(title, columns, cells, width, widest=widest_progress_row(rows))
    return Group(table, *_stop_lines(rows))


def judged(rows: list[dict[str, Any]]) -> str:
    """The name of the metric the tables lead with: what the detector judged (recon LPIPS with real weights,
    the held-out flow loss on the stand-in)."""
    words = {r.get("judge_words") for r in rows} - {None}
    return words.pop() if len(words) == 1 else "recon LPIPS" if not words else "judged metric"


def summary_columns_for(metric: str) -> list[Column]:
    return [
        Column("arm"),
        Column("GPU", priority=4, justify="right"),
        Column("state / decision"),
        Column(f"first {metric}", priority=2, short="first", justify="right"),
        Column(f"best {metric} ± SE", short="best ± SE", justify="right"),
        Column("@ step", justify="right"),
        Column(f"final {metric}", priority=1, short="final", justify="right"),
        Column("iter/s", priority=3, justify="right"),
    ]


def summary_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    """The demo's result per arm: arm, GPU, state/decision (@ step), first, best (+- SE, @ step) and final
    value of the judged metric, iter/s, device-hours the detector's stop saved."""
    out = []
    for r in rows:
        state = r["state"] if not r["decision"] else f"{r['state']} / {r['decision']}"
        if r["detector_stop"]:
            state += f" @{r['decision_step']}"
        best = f"{number(r['best'], '.3f')} ± {number(r['best_se'], '.3f')}" if r["best"] is not None else "-"
        first = f"{number(r['first'], '.3f')} @{r['first_step']}" if r["first"] is not None else "-"
        best_at = str(r["best_step"] or "-")
        out.append(
            [r["arm"], r["gpu"] or "-", state, first, best, best_at, number(r["final"], ".3f"),
             number(r["iter_s"], ".1f"), _saved(r["hours_saved"])]
        )
    return out


def summary_columns(device: str, metric: str = "recon LPIPS") -> list[Column]:
    return [*summary_columns_for(metric), Column(f"{device}-h saved", priority=5, short="saved", justify="right")]


def summary_table(rows: list[dict[str, Any]], device: str = "CPU", width: int | None = None) -> Table:
    columns = summary_columns(device, judged(rows))
    table, _ = build_table("ablate demo: result per arm", columns, summary_rows(rows), width)
    return table


class _ApiServer:
    """uvicorn in a daemon thread (API + dashboard), stopped by flag."""

    def __init__(self, settings: Settings, host: str, port: int) -> None:
        import uvicorn

        from orchestrator.server import build_app

        config = uvicorn.Config(build_app(settings), host=host, port=port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="ablate-api", daemon=True)

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(5)


def _follow(
    console: Console, read_rows: Callable[[], list[dict[str, Any]]], t0: float, url: str, device: str,
    poll_s: float = 1.0,
) -> None:
    """Until every arm is final: a live table on a terminal; into a file or pipe, a line per stop (a live
    table there would be printed at an arbitrary width)."""
    announced: set[str] = set()
    live = live_view(console) if console.is_terminal else None
    with live or contextlib.nullcontext():
        while True:
            rows = read_rows()
            if live is not None:
                frame = _progress_table(rows, time.monotonic() - t0, url, device, console.width)
                live.update(WrappedAtWidth(frame), refresh=True)
            else:
                for r in rows:
                    if r["state"] in TERMINAL_STATES and r["arm"] not in announced:
                        announced.add(r["arm"])
                        console.print(f"{time.monotonic() - t0:4.0f} s  {r['arm']} {r['state']}", soft_wrap=True)
            if rows and all(r["state"] in TERMINAL_STATES for r in rows):
                break
            time.sleep(poll_s)
    console.print()


def closing_lines(url: str, grid_id: int, hold: bool) -> list[str]:
    """The demo's last lines: the report's link, and whether its links outlive the command (they end with it
    unless --hold keeps the server up)."""
    report = f"report (each arm against its parent and the control): {url}api/grids/{grid_id}/report.html"
    if hold:
        return [report, "serving the dashboard; Ctrl-C to end"]
    return [report, "the dashboard and report links end with this command: `ablate demo --hold` keeps them up "
                    f"(or `ablate report {grid_id}` writes the report to files)"]


@app.command()
def demo(
    port: Annotated[int | None, typer.Option(help="Dashboard/API port (default: ABLATE_PORT, else any free)")] = None,
    hold: Annotated[bool, typer.Option(help="Keep serving the dashboard after the arms finish (Ctrl-C ends)")] = False,
) -> None:
    """Train arms A-D and one that breaks (tiny, shapes) on 5 logical GPUs with the full controller; the
    detector stops the broken one live; then a per-arm table."""
    from orchestrator.db.session import session_scope, upgrade
    from orchestrator.grids.service import GridCreate, create_grid
    from orchestrator.loop import loop_listeners
    from orchestrator.runs.launcher import Launcher

    settings = demo_settings(load_settings())
    upgrade(settings.database_url)
    own_db = "ABLATE_DATABASE_URL" not in os.environ
    if own_db:
        _retire_leftovers(settings)
    host = settings.host
    port = free_port(host, port or settings.port, or_any=True)  # the demo must not fail because 8000 is taken
    if port is None:
        raise CLIError(f"no free port on {host}")
    url = f"http://{host}:{port}/"
    # Logical GPUs are CPU processes here: the hours a stop saves are CPU-hours.
    device = "CPU" if settings.logical_gpus else "GPU"
    backbone, lpips_line = demo_lpips(settings)
    body = demo_grid(backbone)
    console.print(lpips_line)
    # A real DINOv2 ViT-B/14 forward per training step would take the tiny arm D from seconds to minutes on CPU.
    console.print("REPA (arm D): random stand-in teacher (real DINOv2 is too slow for a CPU demo; labelled on the run)")
    t0 = time.monotonic()
    # This machine is a node like any other: its agent (a child process) runs its Ray and workers, whose
    # logs stay in Ray's session logs instead of tearing through the live table.
    console.print(f"local node: {settings.logical_gpus or 'detected'} GPUs; database {settings.database_url}")
    launcher = Launcher(settings, listeners=loop_listeners(settings))
    api = _ApiServer(settings, host, port)
    try:
        api.start()
        launcher.start()
        with session_scope(settings.database_url) as session:
            grid_id = create_grid(session, GridCreate(**body)).id
        labels = [a if isinstance(a, str) else a["name"] for a in body["arms"]]
        console.print(f"submitted grid {grid_id} ({', '.join(labels)}); dashboard: {url}")
        _follow(console, lambda: _rows(settings, grid_id), t0, url, device)
        elapsed = time.monotonic() - t0
        rows = _rows(settings, grid_id)
        print_table("ablate demo: result per arm", summary_columns(device, judged(rows)), summary_rows(rows), console)
        backbones = sorted({r["backbone"] for r in rows if r["backbone"]})
        console.print(f"LPIPS backbone: {', '.join(backbones) or '-'}   total {elapsed:.0f} s   dashboard {url}")
        for line in _stop_lines(rows):
            console.print(line)
        for r in rows:
            if r["reason"] and r["state"] != RunState.completed and not r["detector_stop"]:
                console.print(f"  {r['arm']}: {r['reason'].splitlines()[0]}")
        console.print(f"checkpoints: {Path(settings.home_dir).resolve() / 'runs'}")
        for line in closing_lines(url, grid_id, hold):
            console.print(line)
        if hold:
            while True:
                time.sleep(1)
    except KeyboardInterrupt:
        console.print("interrupted: the demo's runs end with it")
        if own_db:
            _retire_leftovers(settings)
    finally:
        launcher.stop()  # closes the local agent: its Ray and the demo's workers end with it
        api.stop()
