"""What a refused CLI command must look like: exit status 2 and one stderr line that names the file and what
was wrong, quoting the offending text cut short, never a traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path


def assert_refused_in_one_line(out: subprocess.CompletedProcess[str], path: Path, said: str) -> None:
    assert out.returncode == 2, (out.stdout, out.stderr[-2000:])
    assert said in out.stderr and str(path) in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr[-2000:]
    assert len(out.stderr) < 1000  # the offending text is quoted cut short, never whole
