"""Core commands: serve, db upgrade, submit, status, arms (the foundation issue)."""

from __future__ import annotations

from orchestrator.cli import app  # noqa: F401
