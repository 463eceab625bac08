"""The last line of a test run that skipped tests: their count and the line that installs what they need."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def _pytest(tmp_path: Path, body: str) -> list[str]:
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_sessionfinish  # noqa: F401\n")
    (tmp_path / "test_some.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)]
    out = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    return out.stdout.strip().splitlines()


def test_a_run_with_skips_ends_with_their_count_and_the_install_line(tmp_path: Path) -> None:
    lines = _pytest(tmp_path, "import pytest\n\ndef test_a():\n    pytest.skip('needs chromium')\n\n"
                              "def test_b():\n    pytest.skip('needs sshd')\n\ndef test_c():\n    pass\n")
    assert "1 passed, 2 skipped" in lines[-2]
    assert lines[-1] == ("2 tests skipped (reasons: pytest -rs); to run every test: apt-get install -y "
                         "--no-install-recommends chromium openssh-server postgresql iproute2 nftables "
                         "&& apt-get install -y buildah podman runc debootstrap")


def test_a_run_without_skips_says_nothing_more(tmp_path: Path) -> None:
    lines = _pytest(tmp_path, "def test_c():\n    pass\n")
    assert "1 passed" in lines[-1]
