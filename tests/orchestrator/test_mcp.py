"""`ablate mcp` through the official SDK's own stdio client: the tools an agent needs, the status naming a real
controller's grids, and a submit without a GPU-hours cap refused."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from orchestrator.db.session import session_scope, upgrade
from orchestrator.grids.service import GridCreate, create_grid
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
