"""Start the controller: migrate the database, settle the API token, serve the app with uvicorn."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from orchestrator.app import create_app
from orchestrator.db.session import upgrade
from orchestrator.messages import masked_url
from orchestrator.settings import MIN_TOKEN_LENGTH, Settings, SettingsError


def read_token(settings: Settings) -> str | None:
    """The configured token, else the one stored under the home dir, else None; SettingsError for one
    shorter than MIN_TOKEN_LENGTH (it is the only guard on writes)."""
    if settings.api_token:
        if len(settings.api_token) < MIN_TOKEN_LENGTH:
            raise SettingsError(
                f"invalid settings: ABLATE_API_TOKEN: must be at least {MIN_TOKEN_LENGTH} characters "
                "(unset it and `ablate serve` generates one)"
            )
        return settings.api_token
    path = settings.token_file
    if path.is_file():
        token = path.read_text().strip() or None
        if token is not None and len(token) < MIN_TOKEN_LENGTH:
            raise SettingsError(
                f"the API token in {path} is shorter than {MIN_TOKEN_LENGTH} characters: delete the file "
                "(a new one is generated) or write a longer one"
            )
        return token
    return None


def _write_token(path: Path) -> str:
    token = secrets.token_urlsafe(32)
    _private_dir(path.parent)
    # Owner-only from the first byte: the token grants every write. fchmod too: O_CREAT's mode applies
    # only to a new file, and a pre-existing (e.g. empty, 0644) one would keep its mode.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    return token


def _private_dir(path: Path) -> None:
    """Create `path` owner-only (0700), or make it so: it holds the token, the database and checkpoints."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)


def _private_sqlite(database_url: str) -> None:
    """An SQLite database holds every spec and result: owner-only (0600), its WAL and shm files too
    (SQLite gives those the database file's mode when it creates them)."""
    if not database_url.startswith("sqlite:///"):
        return
    db = Path(database_url.removeprefix("sqlite:///"))
    for path in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        if path.exists():
            path.chmod(0o600)


def prepare(settings: Settings) -> str:
    """Upgrade the database to the newest schema and return the API token (generated if none exists)."""
    _private_dir(settings.home_dir)
    if settings.database_url.startswith("sqlite:///"):  # a directory we create is owner-only; others stay
        Path(settings.database_url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    upgrade(settings.database_url)
    _private_sqlite(settings.database_url)
    print(f"database: {masked_url(settings.database_url)} (migrated to head)")
    token = read_token(settings)
    if token is None:
        token = _write_token(settings.token_file)
        print(f"generated an API token into {settings.token_file} (or set ABLATE_API_TOKEN)")
    header = "$ABLATE_API_TOKEN" if settings.api_token else f"$(cat {settings.token_file})"
    print(f'writes need the token: curl -H "Authorization: Bearer {header}" ...')
    return token


def build_app(settings: Settings) -> FastAPI:
    """The app the server runs: migrated DB, token settled. Startup hooks (the launcher) attach here."""
    return create_app(settings, prepare(settings))


def serve(settings: Settings, host: str | None = None, port: int | None = None) -> None:
    """Run the controller in the foreground until interrupted."""
    import uvicorn

    from orchestrator.sweeps.runner import attach_sweep_runner

    app = build_app(settings)
    attach_launcher(app)  # starts with the app (opens each node's agent link), stops with it
    attach_sweep_runner(app)  # fires due schedules (cron) and drives their sweeps
    uvicorn.run(app, host=host or settings.host, port=port or settings.port, log_level="info")


def attach_launcher(app: Any) -> None:
    """Run a Launcher for the app's lifetime (`ablate serve`), through its startup/shutdown hooks."""

    def start(app: Any) -> None:
        from orchestrator.loop import loop_listeners
        from orchestrator.runs.launcher import Launcher

        settings = app.state.settings
        app.state.launcher = Launcher(settings, listeners=loop_listeners(settings))
        app.state.launcher.start()
        print(f"launcher: started (workers' Ray namespace {app.state.settings.ray_namespace!r})")

    def stop(app: Any) -> None:
        launcher = getattr(app.state, "launcher", None)
        if launcher is None:
            return
        if not launcher.stop():
            print("launcher: its last pass did not end in time; exiting without it")
        else:
            print("launcher: stopped (nodes' workers train on; a restarted controller adopts them)")

    app.state.startup_hooks.append(start)
    app.state.shutdown_hooks.append(stop)
