"""A Python client of the REST API, for notebooks and scripts: `Client(url, token)`.

    from orchestrator.client import Client
    ablate = Client("http://127.0.0.1:8000", token)
    ablate.effects(3)  # the grid's effects as a pandas DataFrame

Every answer is validated with the API's own models (`orchestrator.api.schemas`, the report's
`GridReport`), so a field is named once, server and client alike. `metrics` and `effects` are tables: pandas
DataFrames when pandas is installed (`pip install 'ablate-dit[notebook]'`), else lists of dicts. An error answer
raises `ApiError` naming the status and the API's own message.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter

from orchestrator.api.schemas import (
    CurvesImport,
    EventPublic,
    GridCreate,
    GridCreated,
    GridDetail,
    GridPublic,
    GridStopped,
    MetricPublic,
    NodePublic,
    ProbeResult,
    RunPublic,
    RunStopped,
    SchedulePublic,
)
from orchestrator.fleet.providers.owned import InstanceDestroyed, OwnedInstances
from orchestrator.grids.projection import Rates, RatesPublic
from orchestrator.grids.stopping import nothing_to_ask
from orchestrator.messages import errors_text
from orchestrator.results.deciding.grid_decision import GridDecision
from orchestrator.results.evaluations import EvaluationView
from orchestrator.results.reports.model import GridReport

T = TypeVar("T")
TIMEOUT_S = 30.0
NodeAction = Literal["bootstrap", "drain", "teardown"]
# An effect's nested parts (the noise budget, each seed's difference) stay on the report; a table row is flat.
EFFECT_NESTED = frozenset({"budget", "per_seed"})


class ApiError(RuntimeError):
    """The API answered an error: `status` and the API's own message (a 422's field paths included)."""

    def __init__(self, method: str, path: str, status: int, message: str) -> None:
        self.status, self.message = status, message
        super().__init__(f"{method} {path}: HTTP {status}: {message}")


def api_message(resp: httpx.Response) -> str:
    """The API's message of an error answer: its `detail` text, or a 422's fields as `arms.1: ...; ...`."""
    try:
        detail = resp.json().get("detail")
    except (ValueError, AttributeError):
        return resp.text[:300] or resp.reason_phrase
    if isinstance(detail, list):
        return errors_text(detail, root="(body)", skip=1)
    return str(detail) if detail is not None else resp.text[:300]


def table(rows: list[dict[str, Any]]) -> Any:  # noqa: ANN401 - a DataFrame, or the rows without pandas
    """`rows` as a pandas DataFrame when pandas is installed, else as they are."""
    try:
        import pandas
    except ImportError:
        return rows
    return pandas.DataFrame.from_records(rows)


class Client:
    """One ablate server. `token` is needed for what changes something (submit, stop); reads go without.
    `timeout` None waits for an answer as long as it takes (a node's SSH work); connecting never does."""

    def __init__(self, url: str, token: str | None = None, timeout: float | None = TIMEOUT_S) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=httpx.Timeout(timeout, connect=TIMEOUT_S))

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- what the API holds -----------------------------------------------------------------------------

    def grids(self, limit: int = 100) -> list[GridPublic]:
        """The grids, newest first."""
        return self._parse(self._request("GET", "/api/grids", params={"limit": limit}), list[GridPublic])

    def grid(self, grid_id: int) -> GridDetail:
        """One grid with its runs and their latest metrics."""
        return self._get(f"/api/grids/{grid_id}", GridDetail)

    def run(self, run_id: int) -> RunPublic:
        return self._get(f"/api/runs/{run_id}", RunPublic)

    def report(self, grid_id: int) -> GridReport:
        """The grid's report (what `effects` reads), as GET /api/grids/{id}/report.json has it now."""
        return self._get(f"/api/grids/{grid_id}/report.json", GridReport)

    def report_text(self, grid_id: int, fmt: str) -> str:
        """The report rendered by the controller: "html", "json" or "md"."""
        return self._request("GET", f"/api/grids/{grid_id}/report.{fmt}").text

    def decision(self, grid_id: int) -> GridDecision:
        """A deciding grid's decision: each comparison's verdict and interval, spend against its cap, what is open."""
        return self._get(f"/api/grids/{grid_id}/decision", GridDecision)

    def events(self, node: str | None = None, run: int | None = None, grid: int | None = None,
               kind: str | None = None, limit: int = 100) -> list[EventPublic]:
        """Events newest first (the token: a node's commands are infrastructure)."""
        params = {k: v for k, v in {"node": node, "run": run, "grid": grid, "kind": kind}.items() if v is not None}
        return self._parse(self._request("GET", "/api/events", params={**params, "limit": limit}),
                           list[EventPublic])

    def nodes(self) -> list[NodePublic]:
        """The registered nodes (the token)."""
        return self._get("/api/nodes", list[NodePublic])

    def schedules(self) -> list[SchedulePublic]:
        """The schedules with their latest sweeps (the token)."""
        return self._get("/api/schedules", list[SchedulePublic])

    def instances(self) -> OwnedInstances:
        """What the controller rented now, asked of each provider it has a key for, with the cost so far."""
        return self._get("/api/instances", OwnedInstances)

    def rates(self, gpu_model: str | None = None) -> Rates:
        """The steps per second the controller measured (what a plan projects runs with)."""
        params = {"gpu_model": gpu_model} if gpu_model else {}
        return self._parse(self._request("GET", "/api/rates", params=params), RatesPublic).rates()

    def evaluation(self, grid_id: int, evaluation_id: int) -> EvaluationView:
        return self._get(f"/api/grids/{grid_id}/evaluations/{evaluation_id}", EvaluationView)

    def metrics(self, run_id: int) -> Any:  # noqa: ANN401 - a DataFrame, or a list of dicts
        """Every checkpoint of the run, one row per step (metrics, their SEs and n; `extra` left out)."""
        points = self._get(f"/api/runs/{run_id}/metrics", list[MetricPublic])
        return table([p.model_dump(exclude={"extra"}) for p in points])

    def effects(self, grid_id: int) -> Any:  # noqa: ANN401 - a DataFrame, or a list of dicts
        """The grid's effects, one row per arm x comparator x metric (diff, its 95% interval, the reading)."""
        return table([e.model_dump(exclude=EFFECT_NESTED) for e in self.report(grid_id).effects])

    # -- what changes something (the token) -------------------------------------------------------------

    def submit(self, body: GridCreate | dict[str, Any]) -> GridCreated:
        """Submit a grid (the body of POST /api/grids, as `ablate submit`'s file holds it)."""
        if isinstance(body, GridCreate):
            body = body.model_dump(mode="json", exclude_unset=True)
        return self._parse(self._request("POST", "/api/grids", json=body), GridCreated)

    def stop(self, run_ids: list[int] | tuple[int, ...] = (), grid: int | None = None) -> list[RunStopped]:
        """Stop runs gracefully (queued: at once; running: at the next step, a checkpoint kept): every run of
        `grid`, and each of `run_ids`. Stopping what ended or is being stopped already is no error: each
        run's `outcome` says what the request did."""
        if not run_ids and grid is None:
            raise ValueError("stop what? give run_ids, grid or both")
        done: list[RunStopped] = []
        if grid is not None:
            done += self._parse(self._request("POST", f"/api/grids/{grid}/stop"), GridStopped).runs
        for run_id in run_ids:
            done.append(self._stop_run(run_id))
        return done

    def import_curves(self, body: CurvesImport | dict[str, Any]) -> GridDetail:
        """Store recorded curves as a finished grid, the detector replayed over them (POST /api/grids/import)."""
        if isinstance(body, CurvesImport):
            body = body.model_dump(mode="json", exclude_unset=True)
        # A diverged curve holds NaN: sent as the literal the controller's JSON reader takes (httpx refuses it).
        content = json.dumps(body, allow_nan=True)
        resp = self._request("POST", "/api/grids/import", content=content,
                             headers={"Content-Type": "application/json"})
        return self._parse(resp, GridDetail)

    def evaluate(self, grid_id: int, body: dict[str, Any]) -> int:
        """Queue an evaluation of the grid's stored checkpoints (POST /api/grids/{id}/evaluations); its id."""
        return int(self._request("POST", f"/api/grids/{grid_id}/evaluations", json=body).json()["id"])

    def cancel_evaluation(self, grid_id: int, evaluation_id: int) -> EvaluationView:
        """Cancel an evaluation: its queued jobs never start, its running ones are ended."""
        return self._parse(self._request("DELETE", f"/api/grids/{grid_id}/evaluations/{evaluation_id}"),
                           EvaluationView)

    def add_node(self, body: dict[str, Any]) -> NodePublic:
        """Register a node (POST /api/nodes); its key files are paths on the controller, under its
        ABLATE_SSH_KEY_DIRS."""
        return self._parse(self._request("POST", "/api/nodes", json=body), NodePublic)

    def update_node(self, name: str, body: dict[str, Any]) -> NodePublic:
        """Declare a node's GPUs or trust (PATCH /api/nodes/{name})."""
        return self._parse(self._request("PATCH", f"/api/nodes/{quote(name, safe='')}", json=body), NodePublic)

    def remove_node(self, name: str) -> None:
        """Forget a node; the machine is not touched."""
        self._request("DELETE", f"/api/nodes/{quote(name, safe='')}")

    def probe_node(self, name: str) -> ProbeResult:
        """The controller SSHes to the node: its GPUs, free disk and Python, stored on the node."""
        return self._parse(self._request("POST", f"/api/nodes/{quote(name, safe='')}/probe"), ProbeResult)

    def node_action(self, name: str, action: NodeAction) -> NodePublic:
        """Bootstrap, drain or tear down a node over SSH; answers when its commands have ended."""
        return self._parse(self._request("POST", f"/api/nodes/{quote(name, safe='')}/{action}"), NodePublic)

    def create_schedule(self, body: dict[str, Any]) -> SchedulePublic:
        """Store a schedule (POST /api/schedules); its grid is validated now, against the controller's limits."""
        return self._parse(self._request("POST", "/api/schedules", json=body), SchedulePublic)

    def schedule_action(self, name: str, action: Literal["pause", "resume"]) -> SchedulePublic:
        """Pause a schedule's fires, or fire again from its next cron time."""
        return self._parse(self._request("POST", f"/api/schedules/{quote(name, safe='')}/{action}"), SchedulePublic)

    def delete_schedule(self, name: str) -> None:
        """Delete a schedule and its sweep history (a 409 while a sweep is under way)."""
        self._request("DELETE", f"/api/schedules/{quote(name, safe='')}")

    def destroy_instance(self, provider: str, instance_id: str, force: bool = False) -> InstanceDestroyed:
        """End a rental and wait for the provider to confirm it (409: not this controller's, unless `force`)."""
        path = f"/api/instances/{quote(provider, safe='')}/{quote(instance_id, safe='')}"
        return self._parse(self._request("DELETE", path, params={"force": force}), InstanceDestroyed)

    def _stop_run(self, run_id: int) -> RunStopped:
        before = self.run(run_id)  # an unknown id is a 404 here, before anything is asked
        standing = nothing_to_ask(before.state, before.stop_requested)
        if standing is not None:
            return RunStopped.of(before, standing)
        resp = self._request("POST", f"/api/runs/{run_id}/stop", allow=(409,))
        if resp.status_code == 409:  # it ended since it was read: nothing to stop, and no error
            return RunStopped.of(self.run(run_id), "already_ended")
        run = self._parse(resp, RunPublic)
        return RunStopped.of(run, "stopped" if run.state == "stopped" else "stop_requested")

    # -- one request ------------------------------------------------------------------------------------

    def _get(self, path: str, model: type[T] | Any) -> T:  # noqa: ANN401 - a model or a list of one
        return self._parse(self._request("GET", path), model)

    def _request(self, method: str, path: str, allow: tuple[int, ...] = (), **kwargs: Any) -> httpx.Response:
        try:
            resp = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ApiError(method, path, 0, f"no ablate server reachable at {self.url}: {exc}") from None
        if resp.is_error and resp.status_code not in allow:
            raise ApiError(method, path, resp.status_code, api_message(resp))
        return resp

    @staticmethod
    def _parse(resp: httpx.Response, model: type[T] | Any) -> T:  # noqa: ANN401 - a model or a list of one
        """The answer validated by the API's own model (a pydantic ValidationError if it does not fit)."""
        return TypeAdapter(model).validate_json(resp.content)

