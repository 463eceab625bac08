"""The stdlib client a Python trainer uses: the lines and files it writes are the ones worker/command.py reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker import command_client as client


def test_the_client_speaks_the_files_of_the_contract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    monkeypatch.setenv("ABLATE_RUN_DIR", str(run))
    monkeypatch.setenv("ABLATE_METRICS_FILE", str(run / "m.jsonl"))
    monkeypatch.setenv("ABLATE_STOP_FILE", str(run / "STOP"))
    monkeypatch.setenv("ABLATE_RESUMED", "0")
    ckpts = client.checkpoint_dir()
    assert ckpts == run / "checkpoints" and ckpts.is_dir() and not client.resumed()
    client.report(10, checkpoint="step_10.pt", val_loss=0.5)
    client.report(20, checkpoint=ckpts / "step_20.pt", val_loss=float("nan"))
    lines = [json.loads(line) for line in (run / "m.jsonl").read_text().splitlines()]
    assert lines == [
        {"step": 10, "val_loss": 0.5, "checkpoint": "checkpoints/step_10.pt"},
        {"step": 20, "val_loss": "nan", "checkpoint": "checkpoints/step_20.pt"},
    ]
    assert not client.should_stop()
    (run / "STOP").touch()
    assert client.should_stop()
