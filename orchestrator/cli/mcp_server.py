"""`ablate mcp`: a Model Context Protocol server over stdio (the official `mcp` SDK) for research agents. Each
tool asks the controller's REST API (ABLATE_URL, ABLATE_API_TOKEN), as the CLI does: plan a grid, submit one
(only with a GPU-hours cap, decide.max_gpu_hours), read the status and a grid's decision, evaluate, stop."""

from __future__ import annotations

from typing import Any

from orchestrator.cli import app
from orchestrator.cli.remote import UrlOption

NO_CAP = ("refused: a grid submitted through ablate mcp must carry a GPU-hours cap: add decide.max_gpu_hours "
          "(e.g. decide: {alpha: 0.05, max_gpu_hours: 4}); the plan tool prices it first")


def build_server(url: str | None) -> Any:  # noqa: ANN401 - an mcp MCPServer
    """The MCP server and its tools; each answers JSON text, or one line saying what went wrong."""
    from mcp.server.mcpserver import MCPServer

    from orchestrator.cli import CLIError
    from orchestrator.cli.remote import controller
    from orchestrator.grids.night import plan_grid as night_plan
    from orchestrator.grids.projection import Rates
    from orchestrator.grids.service import GridCreate, GridError, resolve_grid

    server = MCPServer("ablate")

    def answer(read: Any) -> Any:  # noqa: ANN401 - a callable of the client
        try:
            with controller(url, token_needed=True) as client:
                found = read(client)
        except CLIError as exc:
            return {"error": str(exc)}
        return found.model_dump(mode="json") if hasattr(found, "model_dump") else found

    @server.tool()
    def status() -> Any:  # noqa: ANN401
        """The controller's grids, newest first: id, name, control, each run state's count."""
        return answer(lambda c: [g.model_dump(mode="json") for g in c.grids()])

    @server.tool()
    def grid_decision(grid_id: int) -> Any:  # noqa: ANN401
        """A grid's decision: each comparison's verdict (better, worse, equivalent, undecided, open), its
        interval (low, high), the alpha it spent and the error rate held, GPU-hours spent against
        max_gpu_hours, and what each open comparison still runs to decide."""
        return answer(lambda c: c.decision(grid_id))

    @server.tool()
    def plan(grid: dict[str, Any], gpus: int) -> Any:  # noqa: ANN401
        """The night plan of a grid body (as POST /api/grids takes it) on one node of `gpus` GPUs: each run's
        GPUs, start and end, the night in hours and its GPU-hours, at the controller's measured rates."""
        try:
            body = GridCreate.model_validate(grid)
            resolved = resolve_grid(body)
        except GridError as exc:
            return {"error": exc.message()}
        except ValueError as exc:
            return {"error": str(exc)}
        measured = answer(lambda c: c.rates())  # no controller: the FLOP estimate
        rates = Rates(None, {}) if isinstance(measured, dict) else measured
        found = night_plan(resolved, body.first_seeds(), {"node": gpus}, rates, body.gpus_per_arm == "auto")
        return found.model_dump(mode="json") if found is not None else {"error": "gpus must be 1 or more"}

    @server.tool()
    def submit(grid: dict[str, Any]) -> Any:  # noqa: ANN401
        """Submit a deciding grid (the body of POST /api/grids). It must carry decide.max_gpu_hours: an agent's
        grid is capped in GPU-hours, or refused. Answers its id, runs and projected GPU-hours."""
        if not isinstance((grid.get("decide") or {}).get("max_gpu_hours"), int | float):
            return {"error": NO_CAP}
        return answer(lambda c: c.submit(grid))

    @server.tool()
    def evaluate(grid_id: int, images: int | None = None, step: str = "final") -> Any:  # noqa: ANN401
        """Evaluate the grid's stored checkpoints again on more held-out images; answers the evaluation's id
        (read it with the REST API's GET /api/grids/{id}/evaluations/{eid}; its `waiting` says why it waits)."""
        return answer(lambda c: {"evaluation": c.evaluate(grid_id, {"images": images, "step": step})})

    @server.tool()
    def stop(grid_id: int) -> Any:  # noqa: ANN401
        """Stop every run of the grid gracefully (queued at once, running at the next step with a checkpoint)."""
        return answer(lambda c: [r.model_dump(mode="json") for r in c.stop(grid=grid_id)])

    return server


@app.command("mcp")
def mcp_command(url: UrlOption = None) -> None:
    """Serve the Model Context Protocol over stdio for an agent: tools to plan, submit (with a GPU-hours cap),
    read status and a grid's decision, evaluate and stop, through the controller's REST API and token."""
    build_server(url).run("stdio")
