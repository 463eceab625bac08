"""The FastAPI application factory. No torch import here: the API must start in well under a second."""

from __future__ import annotations

from fastapi import FastAPI

from orchestrator.settings import Settings


def create_app(settings: Settings, api_token: str) -> FastAPI:
    """The controller's app. `api_token` guards every write (see orchestrator.api.deps.require_token)."""
    app = FastAPI(title="ablate", version="0.1.0", description="Ablation orchestration for DiT training")
    app.state.settings = settings
    app.state.api_token = api_token
    # Routers are included here, one per resource (orchestrator/api/routes/*.py).
    return app
