"""The FastAPI application: the REST API (orchestrator/api) and the dashboard (orchestrator/dashboard) in one app.
No torch import here: the API must start in well under a second."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator.api.errors import install_error_handlers
from orchestrator.api.routes import (
    arms,
    decisions,
    evaluations,
    events,
    grids,
    health,
    imports,
    instances,
    nodes,
    reports,
    runs,
    samples,
    schedules,
)
from orchestrator.dashboard import install as install_dashboard
from orchestrator.settings import Settings
from orchestrator.web.guard import TokenGuard

# A hook gets the app (settings on app.state.settings). Startup hooks run in order before the first
# request (the launcher registers its start here), shutdown hooks in reverse order after the last.
Hook = Callable[[FastAPI], None]


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    try:
        for hook in app.state.startup_hooks:
            hook(app)
        yield
    finally:
        for hook in reversed(app.state.shutdown_hooks):
            hook(app)


class NoSniff:
    """`X-Content-Type-Options: nosniff` on every response: a browser takes each body as the type the
    controller names, never as what its bytes (a node's, in a sample or a report) look like."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_nosniff(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0].lower() != b"x-content-type-options"]
                message["headers"] = [*headers, (b"x-content-type-options", b"nosniff")]
            await send(message)

        await self.app(scope, receive, send_nosniff if scope["type"] == "http" else send)


def create_app(settings: Settings, api_token: str) -> FastAPI:
    """The controller's app. `api_token` guards every write (see orchestrator.web.deps.require_token)."""
    app = FastAPI(
        title="ablate",
        version="0.1.0",
        description="Ablation orchestration for DiT training",
        lifespan=_lifespan,
        max_body_size=settings.max_body_bytes,  # 413 before the body is parsed
    )
    # Outermost of our own layers: a request without the token is answered before its body is read.
    app.add_middleware(TokenGuard, token=api_token, private_reads=settings.private_reads)
    app.add_middleware(NoSniff)  # added last: outermost, so the guard's 401s carry it too
    app.state.settings = settings
    app.state.api_token = api_token
    app.state.startup_hooks = []
    app.state.shutdown_hooks = []
    install_error_handlers(app)
    # Routers are included here, one per resource (orchestrator/api/routes/*.py); POST /api/grids/import
    # before the grids' own.
    resources = (health, arms, imports, grids, decisions, evaluations, reports, runs, samples, nodes, schedules, events,
                 instances)
    for module in resources:
        app.include_router(module.router)
    # The web dashboard: pages at / and /grids/{id}, their JSON, the CSV export, static files.
    install_dashboard(app)
    return app
