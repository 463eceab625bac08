"""Settings: ABLATE_ variables, defaults, and errors that name the variable."""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from orchestrator.settings import Settings, SettingsError, load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DATABASE_URL", "API_TOKEN", "PORT", "MAX_RETRIES", "LAUNCHER_INTERVAL_S", "SCHEDULER_INTERVAL_S",
                 "RAY_ADDRESS", "HOME_DIR", "STORAGE_DIR"):
        monkeypatch.delenv(f"ABLATE_{name}", raising=False)


def test_defaults_are_embedded_sqlite() -> None:
    s = load_settings()
    assert s.database_url.startswith("sqlite:///") and s.database_url.endswith(".ablate/ablate.db")
    assert s.api_token is None and s.ray_address is None and s.port == 8000


def test_variables_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ABLATE_PORT", "9001")
    monkeypatch.setenv("ABLATE_API_TOKEN", "t0k-0123456789abcdef")
    monkeypatch.setenv("ABLATE_RAY_ADDRESS", "auto")
    s = load_settings()
    assert (s.port, s.api_token, s.ray_address) == (9001, "t0k-0123456789abcdef", "auto")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ABLATE_PORT", "eighty"),
        ("ABLATE_PORT", "70000"),
        ("ABLATE_DATABASE_URL", "mysql://db/x"),
        ("ABLATE_MAX_RETRIES", "-1"),
        ("ABLATE_LAUNCHER_INTERVAL_S", "0"),
        ("ABLATE_MAX_BODY_BYTES", "10"),
        ("ABLATE_OFFLINE", "maybe"),
    ],
)
def test_invalid_value_names_the_variable(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert str(info.value).startswith(f"invalid settings: {name}: ")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("old", "new", "field", "value", "read"),
    [
        ("ABLATE_STORAGE_DIR", "ABLATE_HOME_DIR", "home_dir", "/srv/ablate", Path("/srv/ablate")),
        ("ABLATE_SCHEDULER_INTERVAL_S", "ABLATE_LAUNCHER_INTERVAL_S", "launcher_interval_s", "0.25", 0.25),
    ],
)
def test_a_renamed_variable_still_works_and_says_its_new_name(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, old: str, new: str, field: str, value: str,
    read: object,
) -> None:
    monkeypatch.setenv(old, value)
    with caplog.at_level(logging.WARNING, logger="orchestrator.settings"):
        assert getattr(load_settings(), field) == read
    assert [r.getMessage() for r in caplog.records] == [f"{old} is deprecated: read as {new}; use {new} instead"]

    caplog.clear()
    monkeypatch.delenv(old)
    monkeypatch.setenv(new, value)
    with caplog.at_level(logging.WARNING, logger="orchestrator.settings"):
        assert getattr(load_settings(), field) == read
    assert caplog.records == []


def test_with_both_names_set_the_new_variable_wins_and_the_old_is_called_ignored(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("ABLATE_STORAGE_DIR", "/srv/old")
    monkeypatch.setenv("ABLATE_HOME_DIR", "/srv/new")
    monkeypatch.setenv("ABLATE_SCHEDULER_INTERVAL_S", "0.25")
    monkeypatch.setenv("ABLATE_LAUNCHER_INTERVAL_S", "2")
    with caplog.at_level(logging.WARNING, logger="orchestrator.settings"):
        s = load_settings()
    assert (s.home_dir, s.launcher_interval_s) == (Path("/srv/new"), 2.0)
    assert s.token_file == Path("/srv/new/api_token")
    messages = " | ".join(r.getMessage() for r in caplog.records)
    assert "ABLATE_STORAGE_DIR is deprecated and ignored: ABLATE_HOME_DIR is set" in messages
    assert "ABLATE_SCHEDULER_INTERVAL_S is deprecated and ignored: ABLATE_LAUNCHER_INTERVAL_S is set" in messages


def test_a_bad_value_under_the_old_name_is_named_by_the_new_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ABLATE_SCHEDULER_INTERVAL_S", "0")
    message = str(pytest.raises(SettingsError, load_settings).value)
    assert message.startswith("invalid settings: ABLATE_LAUNCHER_INTERVAL_S: ")


def test_the_old_keywords_still_work_with_a_future_warning() -> None:
    with pytest.warns(FutureWarning, match=r"Settings\(storage_dir=\) is deprecated: read as Settings\(home_dir=\)"):
        assert Settings(storage_dir=Path("/srv/kw")).home_dir == Path("/srv/kw")
    with pytest.warns(FutureWarning, match=r"scheduler_interval_s=\) is deprecated and ignored"):
        assert Settings(scheduler_interval_s=9, launcher_interval_s=3).launcher_interval_s == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new names warn of nothing
        assert Settings(home_dir=Path("/srv/kw"), launcher_interval_s=3).home_dir == Path("/srv/kw")


def test_a_keyword_beats_the_variable_under_either_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ABLATE_STORAGE_DIR", "/srv/env")
    assert Settings(home_dir=Path("/srv/kw")).home_dir == Path("/srv/kw")
    monkeypatch.setenv("ABLATE_HOME_DIR", "/srv/env")
    with pytest.warns(FutureWarning):
        assert Settings(storage_dir=Path("/srv/kw")).home_dir == Path("/srv/kw")


def test_every_bad_variable_is_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ABLATE_PORT", "x")
    monkeypatch.setenv("ABLATE_MAX_RETRIES", "y")
    message = str(pytest.raises(SettingsError, load_settings).value)
    assert "ABLATE_PORT" in message and "ABLATE_MAX_RETRIES" in message


def test_empty_token_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    # An empty token would let "Bearer " through; it must mean "generate one" instead.
    monkeypatch.setenv("ABLATE_API_TOKEN", "")
    assert load_settings().api_token is None


def test_plain_postgres_url_uses_psycopg3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ABLATE_DATABASE_URL", "postgresql://u@h:5432/db")
    assert load_settings().database_url == "postgresql+psycopg://u@h:5432/db"


def test_cli_reports_bad_settings_in_one_line() -> None:
    env = {"ABLATE_PORT": "eighty", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", "from orchestrator.cli import main; main()", "status"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: invalid settings: ABLATE_PORT: "), proc.stderr


def test_short_token_is_checked_where_a_token_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands that need no token (import, train, replay) load the settings with any token; the
    server and `ablate submit` refuse a short one, naming the variable."""
    from orchestrator.server import read_token

    monkeypatch.setenv("ABLATE_API_TOKEN", "x")
    settings = load_settings()
    with pytest.raises(SettingsError, match="^invalid settings: ABLATE_API_TOKEN: must be at least 16"):
        read_token(settings)
