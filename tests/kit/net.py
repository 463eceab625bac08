"""A port free on loopback (or another address of this machine) now; an app served for real in a thread; a
controller served for the CLI."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator.cli import free_port as port_if_free


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, as the OS picks it (the CLI's own check). Nothing listens on it: a
    connection to it is refused at once."""
    port = port_if_free(host, 0)
    assert port is not None, f"binding port 0 on {host} failed"
    return port


@contextmanager
def served(app: Any) -> Iterator[str]:  # noqa: ANN401 - an ASGI app
    """`app` on a free loopback port in a thread (uvicorn), as its base URL; stopped on exit."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not (server.started and server.servers):
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


CLI_TOKEN = "test-token-of-the-cli"  # the CLI refuses a token under 16 characters


@contextmanager
def controller_env(database_url: str, home: Path) -> Iterator[dict[str, str]]:
    """The REST API on `database_url` served for real (no launcher), migrated first as `ablate serve` does,
    as the environment the CLI finds it by: ABLATE_URL and ABLATE_API_TOKEN. A test's SSH key files lie
    under the temp directory: the controller takes them from there (ABLATE_SSH_KEY_DIRS)."""
    from orchestrator.app import create_app
    from orchestrator.db.session import upgrade
    from orchestrator.settings import Settings

    if database_url.startswith("sqlite:///"):
        Path(database_url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    upgrade(database_url)
    settings = Settings(database_url=database_url, home_dir=home, ssh_key_dirs=[Path(tempfile.gettempdir())])
    with served(create_app(settings, CLI_TOKEN)) as url:
        yield {"ABLATE_URL": url, "ABLATE_API_TOKEN": CLI_TOKEN}


# The commands that ask a controller: run with a database only, the test serves one on it for the call.
# `schedules run` is the sweep loop itself: it works on the database.
CONTROLLER_COMMANDS = (
    ("status",), ("events",), ("report",), ("plan",), ("nodes",), ("import",), ("instances",),
    *(("schedules", command) for command in ("create", "list", "pause", "resume", "delete")),
)  # fmt: skip


@contextmanager
def controller_for(args: tuple[str, ...], env: dict[str, str], home: Path) -> Iterator[dict[str, str]]:
    """ABLATE_URL and its token of a controller served on env's ABLATE_DATABASE_URL, where `args` ask one
    and env names none; else nothing (the command runs as it was asked)."""
    database_url = env.get("ABLATE_DATABASE_URL")
    asks = any(args[: len(command)] == command for command in CONTROLLER_COMMANDS)
    if not asks or database_url is None or "ABLATE_URL" in env:
        yield {}
        return
    with controller_env(database_url, home) as found:
        yield found
