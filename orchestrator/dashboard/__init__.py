"""The web dashboard: grid list at `/`, one grid at `/grids/{id}`, served by the controller.

No build step: plain HTML templates, one script, and uPlot vendored under static/vendor/.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from orchestrator.dashboard.routes import STATIC_DIR, STATIC_URL, router

__all__ = ["install", "router"]


def install(app: FastAPI) -> None:
    """Add the dashboard's pages, JSON and static files to the controller app."""
    app.include_router(router)
    app.mount(STATIC_URL, StaticFiles(directory=STATIC_DIR), name="dashboard-static")
