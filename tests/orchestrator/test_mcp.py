"""`ablate mcp` through the official SDK's own stdio client: the tools an agent needs, the status naming a real
controller's grids, and a submit without a GPU-hours cap refused."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from sqlalchemy import select

from orchestrator.db.models import Grid
from orchestrator.db.session import session_scope, upgrade
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.vocabulary import RunState
from tests.kit.net import controller_env


async def _session(env: dict[str, str]) -> tuple[set[str], str, str]:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=["-c", "from orchestrator.cli import main; main()",
                                   "mcp"], env={**env, "PYTHONPATH": os.getcwd()})  # fmt: skip
    async with Client(params) as client:
        tools = {t.name for t in (await client.list_tools()).tools}
        status = await client.call_tool("status", {})
        refused = await client.call_tool("submit", {"grid": {"name": "uncapped", "arms": ["A", "B"]}})
    return tools, _text(status.content), _text(refused.content)


def _text(parts: list) -> str:
    return "".join(getattr(part, "text", "") for part in parts)


def test_an_agent_lists_the_tools_and_reads_the_controllers_grids(database_url: str, tmp_path: Path) -> None:
    upgrade(database_url)
    with session_scope(database_url) as session:
        grid_id = create_grid(session, GridCreate(name="agent-visible", arms=["A", "B"])).id
    with controller_env(database_url, tmp_path / "controller") as env:
        tools, status, refused = asyncio.run(_session(env))
    assert {"submit", "grid_decision", "status", "stop", "plan", "evaluate"} <= tools
    assert "agent-visible" in status and f'"id": {grid_id}' in status.replace('":{', '": {'), status
    assert "refused" in refused and "decide.max_gpu_hours" in refused, refused


async def _stranger(env: dict[str, str], grid_id: int) -> tuple[str, str]:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=["-c", "from orchestrator.cli import main; main()",
                                   "mcp"], env={**env, "PYTHONPATH": os.getcwd()})  # fmt: skip
    capped = {"name": "stranger's", "arms": ["A", "B"], "decide": {"max_gpu_hours": 1}}
    async with Client(params) as client:
        submitted = await client.call_tool("submit", {"grid": capped})
        stopped = await client.call_tool("stop", {"grid_id": grid_id})
    return _text(submitted.content), _text(stopped.content)


def test_an_agent_without_the_controllers_token_changes_nothing(database_url: str, tmp_path: Path) -> None:
    """Issue 63, the agent interface's authentication: `ablate mcp` holds no power of its own. Started with a
    token the controller did not issue, its submit and stop come back as the REST API's refusal, in one line
    naming the token to use, and the controller's grids are as they were (no grid added, no run stopped)."""
    upgrade(database_url)
    with session_scope(database_url) as session:
        grid_id = create_grid(session, GridCreate(name="not theirs", arms=["A", "B"])).id
    with controller_env(database_url, tmp_path / "controller") as env:
        submitted, stopped = asyncio.run(_stranger({**env, "ABLATE_API_TOKEN": "x" * 32}, grid_id))
    for answer in (submitted, stopped):
        assert "rejected the API token" in answer and "ABLATE_API_TOKEN" in answer, answer
    with session_scope(database_url) as session:
        assert session.scalars(select(Grid.name).where(Grid.name == "stranger's")).all() == []
        assert {r.state for r in session.get(Grid, grid_id).runs} == {RunState.queued}
