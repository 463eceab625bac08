"""Shared fixtures: a migrated database per test module (Postgres when ABLATE_DATABASE_URL points at
one, as in CI; a SQLite file otherwise) and the published curves. Tests never download weights:
ABLATE_OFFLINE is on for this process and every subprocess and Ray worker it starts."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from orchestrator.db.session import upgrade

os.environ["ABLATE_OFFLINE"] = "1"  # the download path is tested against a refused proxy, never the network

FIXTURES = Path(__file__).parent / "fixtures"
pytest_plugins = ["tests.kit.launcher"]  # the launcher on a module's Ray, for the tests that ask for it
SERVER_URL = os.environ.get("ABLATE_DATABASE_URL", "")


def _fresh_postgres(server_url: str) -> tuple[str, str]:
    """Create an empty database on the test server; returns (its URL, its name)."""
    name = f"ablate_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(make_url(server_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return make_url(server_url).set(database=name).render_as_string(hide_password=False), name


def _drop_postgres(server_url: str, name: str) -> None:
    admin = create_engine(make_url(server_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="module")
def empty_database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A database with no schema yet (for migration tests)."""
    if SERVER_URL.startswith("postgresql"):
        url, name = _fresh_postgres(SERVER_URL)
        yield url
        _drop_postgres(SERVER_URL, name)
    else:
        yield f"sqlite:///{tmp_path_factory.mktemp('db') / 'ablate.db'}"


@pytest.fixture(scope="module")
def database_url(empty_database_url: str) -> str:
    """A database migrated to head, shared by one test module."""
    upgrade(empty_database_url)
    return empty_database_url


@pytest.fixture(scope="session")
def published_curves() -> dict:
    return json.loads((FIXTURES / "published_ablation_a_to_d.json").read_text())


# What the full run needs beyond pip (README "Tests"); the skip summary repeats it where a newcomer looks.
SYSTEM_PACKAGES = "chromium openssh-server postgresql iproute2 nftables"
IMAGE_TOOLS = "buildah podman runc debootstrap"  # with their recommended packages: Podman's network stack
INSTALL_LINE = f"apt-get install -y --no-install-recommends {SYSTEM_PACKAGES} && apt-get install -y {IMAGE_TOOLS}"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> Iterator[None]:
    """After pytest's own summary, as the run's last line: how many tests skipped, and the line that
    installs what they need (outermost wrapper, so it follows the final counts)."""
    result = yield
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped:
        n = len(skipped)
        reporter.write_line(
            f"{n} test{'s' if n > 1 else ''} skipped (reasons: pytest -rs); to run every test: {INSTALL_LINE}",
            yellow=True,
        )
    return result


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 in server mode on a free loopback port; its endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def online_but_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Downloads allowed (ABLATE_OFFLINE=0) but every HTTP(S) request goes through a proxy on a port just
    closed, so a library's download fails at once and nothing reaches the network."""
    from tests.kit.net import free_port  # project modules only once a fixture runs

    port = free_port()
    monkeypatch.setenv("ABLATE_OFFLINE", "0")
    for var in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(var, f"http://127.0.0.1:{port}")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
