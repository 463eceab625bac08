"""`ablate train`: a real short run through the console script, and the offline-LPIPS error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ABLATE = [sys.executable, "-c", "from orchestrator.cli import main; main()"]


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TORCH_HOME": str(tmp_path / "torch_home"), "COLUMNS": "200"}
    env.pop("ABLATE_LPIPS_WEIGHTS", None)  # no AlexNet weights anywhere: the offline case
    return subprocess.run([*ABLATE, "train", *args], capture_output=True, text=True, env=env, timeout=300)


def test_train_cli_short_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = _run(["A", "--steps", "4", "--checkpoint-every", "2", "--batch-size", "4", "--lpips-standin",
                "--out", str(out)], tmp_path)
    assert res.returncode == 0, res.stderr
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [2, 4]
    for key in ("train_loss", "recon_lpips", "recon_lpips_se", "text_lpips", "text_manip_delta", "iter_per_sec"):
        assert key in lines[-1]
    assert lines[-1]["lpips_backbone"] == "random_standin"
    assert "recon" in res.stdout and "random_standin" in res.stdout  # the table and the label


def test_train_cli_without_lpips_weights_fails_clearly(tmp_path: Path) -> None:
    res = _run(["A", "--steps", "2", "--out", str(tmp_path / "run")], tmp_path)
    assert res.returncode == 2
    assert "lpips_weights" in res.stderr and "--lpips-standin" in res.stderr
    assert "Traceback" not in res.stderr
