"""The tracker tests' environment: W&B offline and an MLflow file store under the test's own folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.orchestrator.trackers.tracker_files import tracker_environment


@pytest.fixture
def tracker_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    tracker_environment(tmp_path, monkeypatch)
    return tmp_path
