"""Checkpoint files: loaded with torch's restricted unpickler, so a planted file cannot run code."""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
import torch

from worker import checkpoint as ckpt


class _Planted:
    """What a hostile checkpoint could hold: unpickling it calls `marker.touch()` (any callable would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (Path.touch, (self.marker,))


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "ckpt_0000010.pt"
    torch.save({"step": 10, "model": {"w": torch.zeros(2)}, "extra": _Planted(marker)}, path)
    with pytest.raises(pickle.UnpicklingError):
        ckpt.load(path)
    assert not marker.exists()


def test_our_own_checkpoint_state_loads_weights_only(tmp_path: Path) -> None:
    state = {
        "step": 3,
        "model": {"w": torch.ones(2)},
        "optimizers": [torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], betas=(0.9, 0.95)).state_dict()],
        "rng": {"torch": torch.get_rng_state(), "data": torch.Generator().manual_seed(1).get_state()},
        "spec": {"name": "A", "schedule": {"lr": 3e-4}},
        "provenance": ckpt.provenance(),
        "fp8_linears": ["blocks.0.attn.qkv"],
    }
    path = tmp_path / "ckpt.pt"
    ckpt.save_atomic(state, path)
    loaded = ckpt.load(path)
    assert loaded["step"] == 3 and torch.equal(loaded["model"]["w"], torch.ones(2))
    assert loaded["optimizers"][0]["param_groups"][0]["betas"] == (0.9, 0.95)
    assert loaded["provenance"]["versions"]["torch"] == str(torch.__version__)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="needs root to mount a tiny tmpfs")
def test_a_full_disk_is_waited_out_not_a_failed_run(tmp_path: Path) -> None:
    from worker.actor import ArmWorker

    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], check=True)
    try:
        filler = disk / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
        os.close(fd)
        worker = ArmWorker.__new__(ArmWorker)  # only the record writer; no training thread
        worker._stop = threading.Event()
        threading.Timer(1.5, filler.unlink).start()  # the operator frees space
        with (disk / "records.jsonl").open("a+") as fh:
            worker._append_durably(fh, '{"step": 10}\n')
        assert (disk / "records.jsonl").read_text() == '{"step": 10}\n'
    finally:
        subprocess.run(["umount", str(disk)], check=False)
