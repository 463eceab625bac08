"""Core commands: serve, db upgrade, submit, status, arms (the foundation issue)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import yaml
from pydantic import ValidationError
from rich.console import Console

from model.spec import STANDIN
from orchestrator.cli import CLIError, app, free_port
from orchestrator.cli.remote import JsonOption, UrlOption, controller, print_json, send
from orchestrator.cli.tables import Column, print_table
from orchestrator.messages import database_error_text, errors_text, masked_url, validation_text, yaml_error_text
from orchestrator.numbers import number
from orchestrator.settings import Settings, load_settings
from orchestrator.vocabulary import RunState

if TYPE_CHECKING:
    from orchestrator.api.schemas import GridDetail, GridPublic

console = Console()
db_app = typer.Typer(no_args_is_help=True, help="The database schema (Alembic migrations).")
app.add_typer(db_app, name="db")


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Interface to bind (default: ABLATE_HOST)")] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="Port (default: ABLATE_PORT)")] = None,
) -> None:
    """Run the controller: migrate the database, then serve the REST API (OpenAPI at /docs)."""
    from orchestrator.server import serve as run_server

    settings = load_settings()
    host, port = host or settings.host, port or settings.port
    if free_port(host, port, or_any=False) is None:
        raise CLIError(f"{host}:{port} is already in use: pass --port or set ABLATE_PORT")
    run_server(settings, host, port)


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument(help="Alembic revision")] = "head") -> None:
    """Create or migrate the database schema (ABLATE_DATABASE_URL) to REVISION."""
    from sqlalchemy.exc import SQLAlchemyError

    from orchestrator.db.session import upgrade

    settings = load_settings()
    try:
        upgrade(settings.database_url, revision)
    except SQLAlchemyError as exc:
        raise CLIError(f"cannot migrate {masked_url(settings.database_url)}: {database_error_text(exc)}") from None
    typer.echo(f"{masked_url(settings.database_url)}: at revision {_current_revision(settings)}")


def _current_revision(settings: Settings) -> str:
    from alembic.migration import MigrationContext

    from orchestrator.db.session import engine_for

    with engine_for(settings.database_url).connect() as conn:
        return MigrationContext.configure(conn).get_current_revision() or "base (empty)"


def load_grid_file(path: Path) -> dict[str, Any]:
    """A grid YAML file (the REST body's fields) as a dict, or a one-line CLIError."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise CLIError(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise CLIError(f"{path} is not valid YAML: {yaml_error_text(exc)}") from None
    if not isinstance(data, dict):
        raise CLIError(f"{path} must hold a mapping with name, arms, overrides, control")
    return data


def resolved_grid_file(grid_file: Path, seeds: int | None) -> tuple[dict[str, Any], Any, list[Any]]:
    """A grid file read (`seeds` over the file's), validated and its arms resolved: (the data, the
    GridCreate, its (label, ArmSpec) pairs); a CLIError naming the file and the field otherwise."""
    from orchestrator.grids.service import GridCreate, GridError, resolve_grid

    data = load_grid_file(grid_file)
    if seeds is not None:
        data = {**data, "seeds": seeds}
    try:
        body = GridCreate.model_validate(data)
        return data, body, resolve_grid(body)
    except ValidationError as exc:
        raise CLIError(f"{grid_file}: {validation_text(exc, root='(grid)')}") from None
    except GridError as exc:
        raise CLIError(f"{grid_file}: {exc.message()}") from None


@app.command()
def submit(
    grid_file: Annotated[Path, typer.Argument(help="YAML grid: name, arms, overrides, control (see arms/demo.yaml)")],
    url: UrlOption = None,
    seeds: Annotated[
        int | None,
        typer.Option(help="Training seeds per arm (1-16): each arm runs N times on one held-out split; "
                     "overrides the file's `seeds`"),
    ] = None,
) -> None:
    """Submit a grid to the running server; prints the new grid's id (and on stderr, with several seeds, its
    cost first, then the server's night plan for it)."""
    from orchestrator.grids.replicates import grid_cost

    # Checked here first so a bad spec fails at once, with its path, even without a server.
    data, body, resolved = resolved_grid_file(grid_file, seeds)
    if body.decide is not None:  # a deciding grid: its worst case and expected GPU-hours
        from orchestrator.results.deciding.submit_cost import decide_cost

        typer.echo(f"submitting {decide_cost(resolved, body.control, body.decide).words}", err=True)
    elif body.seeds > 1:  # what replicates cost, said before anything is queued
        typer.echo(f"submitting {grid_cost([spec for _, spec in resolved], body.seeds).text()}", err=True)

    base, resp = send("POST", "/api/grids", url, json=data)
    if resp.status_code == 422:
        detail = resp.json().get("detail", [])
        raise CLIError(f"{grid_file}: {errors_text(detail, root='(grid)', skip=1)}")
    if resp.status_code != 201:
        raise CLIError(f"{base} answered {resp.status_code}: {resp.text[:200]}")
    created = resp.json()
    for warning in created.get("warnings") or []:  # accepted, yet it will not do what was asked: said first
        typer.echo(f"warning: {warning}", err=True)
    if created.get("plan"):  # the server's plan over its nodes, on stderr: stdout stays the id alone
        from orchestrator.cli.plan_table import print_plan
        from orchestrator.grids.night import PlanPublic

        print_plan(PlanPublic.model_validate(created["plan"]), Console(stderr=True))
    typer.echo(created["id"])


@app.command()
def status(
    grid_id: Annotated[int | None, typer.Argument(help="Show this grid's runs")] = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the controller's grids, or show one grid's runs with their latest metrics and, for a deciding
    grid, each comparison's decision (GET /api/grids, /api/grids/{id} and its /decision)."""
    from orchestrator.cli.decisions import print_decisions
    from orchestrator.client import ApiError

    with controller(url) as client:
        if grid_id is None:
            grids = client.grids()
            print_json(grids) if as_json else _print_grids(grids)
            return
        try:
            grid = client.grid(grid_id)
        except ApiError as exc:
            if exc.status in (404, 422):
                raise CLIError(f"no grid with id {grid_id}; `ablate status` lists them") from None
            raise
        decision = client.decision(grid_id) if grid.decide else None
    if as_json:
        print_json({"grid": grid, "decision": decision})
        return
    _print_runs(grid)
    if decision is not None:
        print_decisions(decision, console)


def _print_grids(grids: list[GridPublic]) -> None:
    columns = [
        Column("id", justify="right"),
        Column("name"),
        Column("control", priority=2),
        Column("source", priority=3),
        Column("created", priority=1),
        Column("runs"),
    ]
    rows = []
    for g in grids:
        states = ", ".join(f"{n} {s}" for s, n in sorted(g.states.items()))
        rows.append([str(g.id), g.name, number(g.control), g.source, f"{g.created_at:%Y-%m-%d %H:%M}", states])
    print_table("grids", columns, rows, console)


def run_columns(judged: str, lpips_column: bool) -> list[Column]:
    """The runs table's columns: the judged metric leads; recon LPIPS beside it only where it is not the judge."""
    return [
        Column("run", justify="right"),
        Column("arm"),
        Column("state"),
        Column("step", priority=2, justify="right"),
        Column(f"{judged} ± SE", short="judged", justify="right"),
        *([Column("recon LPIPS", priority=3, short="recon", justify="right")] if lpips_column else []),
        Column("iter/s", priority=4, justify="right"),
        Column("decision", priority=1),
    ]


def _print_runs(grid: GridDetail) -> None:
    """The grid's runs, led by the metric the detector judges each on (its `judged_metric`): the held-out
    flow loss where LPIPS is the random stand-in, whose values cannot tell arms apart."""
    from orchestrator.results.reports.effects import METRIC_WORDS

    rows = []
    for r in grid.runs:
        judge = r.judged_metric
        value = number(getattr(r, judge))
        if getattr(r, f"{judge}_se") is not None:
            value += f" ± {getattr(r, f'{judge}_se'):.3f}"
        recon = number(r.recon_lpips) + (" (stand-in)" if r.lpips_backbone == STANDIN else "")
        decision = "-"
        if r.decision is not None:
            decision = f"{r.decision} @ {number(r.decision_step)}: {r.decision_reason}"
        state = r.state + (" (stop requested)" if r.stop_requested and r.state == RunState.running else "")
        if r.error and r.state == RunState.failed:  # its first line: type, message and where
            error = r.error.splitlines()[0]
            decision = f"error: {error}" if decision == "-" else f"{decision}; error: {error}"
        arm = f"{r.arm} s{r.seed}" if grid.seeds > 1 else r.arm
        rows.append([str(r.id), arm, state, number(r.latest_step), value, recon, number(r.iter_per_sec, ".3g"),
                     decision])
    lpips_column = any(r.judged_metric != "recon_lpips" for r in grid.runs)
    if not lpips_column:
        rows = [row[:5] + row[6:] for row in rows]
    words = {METRIC_WORDS.get(r.judged_metric, "judged") for r in grid.runs}
    judged = words.pop() if len(words) == 1 else "judged metric"
    seeds = f", {grid.seeds} seeds per arm" if grid.seeds > 1 else ""
    columns = run_columns(judged, lpips_column)
    print_table(f"grid {grid.id}: {grid.name} (control {grid.control}{seeds})", columns, rows, console)


@app.command()
def arms() -> None:
    """The arms A..I, resolved, and what each changes against its parent."""
    from orchestrator.grids.arms import lineage_table

    columns = [Column("arm"), Column("parent"), Column("changes vs parent"), Column("description", priority=1)]
    rows = []
    for row in lineage_table():
        changed = "\n".join(f"{k} = {v}" for k, v in row["changes"].items()) or "(baseline)"
        rows.append([row["arm"], row["parent"] or "-", changed, row["description"]])
    print_table("arms (arms/*.yaml)", columns, rows, console, show_lines=True)
