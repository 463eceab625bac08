"""Where an evaluation job finds the checkpoint it evaluates: the run's directory on the node (its periodic
checkpoint, or best.pt when that is the step), else the run's checkpoint storage (a real file:// store)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from worker.checkpoint import load
from worker.evaluation import SOURCE_NAME, NoCheckpoint, find_checkpoint
from worker.run_files import BEST_NAME, ckpt_name


def save(path: Path, step: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"step": step, "model": {"w": torch.full((2,), float(step))}}, path)
    return path


def test_the_runs_own_directory_first_then_best_pt_of_that_step(tmp_path: Path) -> None:
    run, job = tmp_path / "run", tmp_path / "job"
    periodic = save(run / ckpt_name(20), 20)
    assert find_checkpoint(run, 20, None, job) == periodic
    save(run / BEST_NAME, 10)
    assert find_checkpoint(run, 10, None, job) == run / BEST_NAME  # pruned periodic, kept as best.pt


def test_a_node_without_the_runs_files_copies_the_step_from_storage(tmp_path: Path) -> None:
    store, job = tmp_path / "store", tmp_path / "job"
    save(store / ckpt_name(30), 30)
    save(store / BEST_NAME, 20)
    storage = {"url": f"file://{store}"}
    found = find_checkpoint(tmp_path / "elsewhere", 20, storage, job)
    assert found == job / SOURCE_NAME and load(found)["step"] == 20  # best.pt is step 20's
    with pytest.raises(NoCheckpoint, match=rf"no checkpoint of step 25 in {tmp_path}/elsewhere or file://"):
        find_checkpoint(tmp_path / "elsewhere", 25, storage, job)
