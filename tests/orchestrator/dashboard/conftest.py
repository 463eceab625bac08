"""The dashboard served for real: the published A-D curves imported with `ablate import` (`grid_id`), the
app on a free loopback port (`base_url`), and a headless Chromium (`browser_context`), one per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kit.net import served
from tests.orchestrator.dashboard.browser import FIXTURE, launch_chromium


@pytest.fixture(scope="module")
def grid_id(database_url: str, ablate_cli) -> int:  # type: ignore[no-untyped-def]
    out = ablate_cli(database_url, "import", str(FIXTURE), "--name", "published study A-D (2026)")
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[1])  # "grid N 'name': ..."


@pytest.fixture(scope="module")
def base_url(database_url: str) -> Iterator[str]:
    """The real app on a free loopback port, in a thread."""
    from orchestrator.app import create_app
    from orchestrator.settings import Settings

    with served(create_app(Settings(database_url=database_url), api_token="test-token")) as url:
        yield url


@pytest.fixture(scope="module")
def browser_context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        context = launch_chromium(pw, str(profile))
        yield context
        context.close()
