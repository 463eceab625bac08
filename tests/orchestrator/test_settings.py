"""Settings: ABLATE_ variables, defaults, and errors that name the variable."""

from __future__ import annotations

import subprocess
import sys

import pytest

from orchestrator.settings import SettingsError, load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DATABASE_URL", "API_TOKEN", "PORT", "MAX_RETRIES", "SCHEDULER_INTERVAL_S", "RAY_ADDRESS"):
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
        ("ABLATE_SCHEDULER_INTERVAL_S", "0"),
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
