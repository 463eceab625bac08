"""A migrated database's API client for a test module of runs/ (a module's own fixture of the same name wins)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from orchestrator.app import create_app
from orchestrator.settings import Settings
from tests.kit.settings import API_TOKEN


@pytest.fixture(scope="module")
def settings(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(database_url=database_url, storage_dir=tmp_path_factory.mktemp("storage"))


@pytest.fixture(scope="module")
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings, API_TOKEN)) as c:
        yield c
