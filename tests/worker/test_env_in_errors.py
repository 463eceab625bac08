"""A command arm's env values stay on its node, in its error too: a script's failure quotes what it wrote
(a metrics line that is not JSON, a checkpoint it named), and the first line of the worker's error is the
run's `failed` event, which the dashboard shows every reader and every tracker exports (W&B's events table,
MLflow's events.json). ArmWorker runs as a plain object; the script is a real stdlib process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from orchestrator.grids.command_arms import resolve_command_arm
from tests.kit.polling import final_reply
from worker.actor import ArmWorker
from worker.failure import MASKED

SECRET = "wandb-key-0123456789abcdef"
WRITES = {
    "a metrics line that is not JSON": 'open(os.environ["ABLATE_METRICS_FILE"], "a").write('
                                       '"key=" + os.environ["WANDB_API_KEY"] + " lr=" + os.environ["LR"] + "\\n")',
    "a checkpoint named after it": 'open(os.environ["ABLATE_METRICS_FILE"], "a").write(json.dumps({"step": 1, '
                                   '"val_loss": 1.0, "checkpoint": "checkpoints/" + os.environ["WANDB_API_KEY"]})'
                                   ' + "\\n")',
}


@pytest.mark.parametrize("written", WRITES)
def test_a_command_arm_s_env_value_is_masked_in_its_error(tmp_path: Path, written: str) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(f"import json, os\n{WRITES[written]}\n")
    arm = {"name": "mine", "code": str(code), "command": [sys.executable, "train.py"],
           "env": {"WANDB_API_KEY": SECRET, "LR": "0.5"}, "detector": {"metric": "val_loss"}}  # fmt: skip
    spec, errors = resolve_command_arm(arm, 0, {})
    assert spec is not None, errors
    reply = final_reply(ArmWorker(1, spec.model_dump(mode="json"), str(tmp_path / "run")))
    assert reply["state"] == "error"
    first_line = reply["error"].splitlines()[0]
    assert SECRET not in reply["error"] and MASKED in first_line, first_line
    assert "ABLATE_METRICS_FILE" in first_line, "the failure still says what was wrong"
    if "not JSON" in written:
        assert "lr=0.5" in first_line, "a short value (a setting, not a key) is left as it is"
