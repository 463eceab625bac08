"""ABLATE_OFFLINE: parsed like the service's settings; a bad value is an error naming the variable."""

from __future__ import annotations

import socket

import pytest

from model.hub import download_timeout, offline

CASES = [("1", True), ("true", True), ("0", False), ("off", False), ("", False)]


@pytest.mark.parametrize(("value", "expected"), CASES)
def test_offline_reads_the_variable(monkeypatch: pytest.MonkeyPatch, value: str, expected: bool) -> None:
    monkeypatch.setenv("ABLATE_OFFLINE", value)
    assert offline() is expected


def test_a_bad_offline_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ABLATE_OFFLINE", "maybe")
    with pytest.raises(ValueError, match="ABLATE_OFFLINE='maybe' is not a boolean"):
        offline()


def test_download_timeout_is_restored() -> None:
    before = socket.getdefaulttimeout()
    with download_timeout(5):
        assert socket.getdefaulttimeout() == 5
    assert socket.getdefaulttimeout() == before
