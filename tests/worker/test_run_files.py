"""The run directory's names: one step pattern for checkpoints and sample folders, the actor's records
file among them, and the module free of torch (the controller imports it)."""

from __future__ import annotations

import subprocess
import sys

from worker import actor
from worker.run_files import CKPT_RE, RECORDS_NAME, SAMPLE_FILE_RE, SAMPLE_STEP_RE, ckpt_name, sample_dir


def test_checkpoints_and_sample_folders_read_back_the_step_they_were_written_with() -> None:
    for step in (0, 30, 5000, 9_999_999, 12_345_678):
        ckpt = CKPT_RE.match(ckpt_name(step))
        folder = SAMPLE_STEP_RE.match(sample_dir(step).rsplit("/", 1)[-1])
        assert ckpt is not None and folder is not None, step
        assert int(ckpt.group(1)) == int(folder.group(1)) == step


def test_names_this_code_never_writes_are_not_a_run_file() -> None:
    for name in ("ckpt_30.pt", "ckpt_0000030.pt.partial", "ckpt_-000003.pt", "ckpt_0000030.pth"):
        assert CKPT_RE.match(name) is None, name
    for name in ("step_30", "step_../../x", "step_0000030x"):
        assert SAMPLE_STEP_RE.match(name) is None, name
    assert SAMPLE_FILE_RE.match("recon_3.png") and not SAMPLE_FILE_RE.match("../recon_3.png")


def test_the_actor_writes_its_records_under_the_name_storage_uploads() -> None:
    assert actor.RECORDS_FILE == RECORDS_NAME


def test_the_names_import_without_torch() -> None:
    code = "import sys, worker.run_files, orchestrator.runs.storage; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
