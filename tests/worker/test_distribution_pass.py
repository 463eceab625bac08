"""The distribution pass in a tiny CPU run: measured at every k-th checkpoint and the last, each MMD with its
per-sample values (their mean is the value), FD with its jackknife SE and bias, every value labelled with its
stand-in extractor, the reference features computed once and read back (hash-checked) by the next run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model.extractors import WEIGHTS_DIR_ENV
from tests.worker.test_train import spec_for
from worker.references import REFERENCES
from worker.train import train_arm

DIST = {"metrics": ["cmmd", "fd_dinov2"], "samples": 32, "every": 2, "sampler_steps": 2}


@pytest.fixture(autouse=True)
def no_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WEIGHTS_DIR_ENV, str(tmp_path / "no-weights"))  # offline: the small stand-ins


def _run(out: Path, seed: int = 0) -> list[dict]:
    spec = spec_for("A", data={"held_out": 40, "seed": seed, "split_seed": 7},
                    schedule={"steps": 12, "checkpoint_every": 4}, eval={"distribution": DIST})  # fmt: skip
    return list(train_arm(spec, out))


def test_every_kth_checkpoint_and_the_last_carry_the_metrics_paired_and_labelled(tmp_path: Path) -> None:
    records = _run(tmp_path / "a")
    assert [r["step"] for r in records] == [4, 8, 12]
    skipped, measured, last = records
    assert "cmmd" not in skipped and "distribution_seconds" not in skipped  # step 4: checkpoint 1 of every 2
    for r in (measured, last):
        assert r["cmmd_n"] == 32 and len(r["cmmd_samples"]) == 32
        assert r["cmmd"] == pytest.approx(sum(r["cmmd_samples"]) / 32, abs=1e-9)  # the U-statistic exactly
        assert len(r["cmmd_per_reference"]) == 40  # one per held-out reference image, whose mean is it too
        assert r["cmmd"] == pytest.approx(sum(r["cmmd_per_reference"]) / 40, abs=1e-9)
        assert r["cmmd_se"] > 0 and r["distribution_seconds"] > 0
        assert r["fd_dinov2_n"] == 32 and r["fd_dinov2_se"] > 0 and "fd_dinov2_samples" not in r
        assert "stand-in" in r["cmmd_extractor"] and "stand-in" in r["fd_dinov2_extractor"]
    assert any(f.startswith(measured["cmmd_extractor"]) for f in last["fallbacks"])  # the reason, on the run
    assert "(computed)" in measured["distribution_reference"] and "(memory)" in last["distribution_reference"]
    assert len(list((tmp_path / "a" / REFERENCES).glob("*.pt"))) == 2  # one per extractor


def test_another_seed_reads_the_same_reference_and_a_corrupt_copy_is_computed_again(tmp_path: Path) -> None:
    runs = _run(tmp_path / "a")
    first = runs[-1]
    (tmp_path / "b").mkdir()
    for f in (tmp_path / "a" / REFERENCES).iterdir():  # the node's cache, as a second run on it finds it
        (tmp_path / "b" / REFERENCES).mkdir(exist_ok=True)
        (tmp_path / "b" / REFERENCES / f.name).write_bytes(f.read_bytes())
    second = _run(tmp_path / "b", seed=1)[1]  # its first measured checkpoint
    assert "(node)" in second["distribution_reference"]
    assert first["distribution_reference"].split("(")[0] == second["distribution_reference"].split("(")[0]
    assert second["cmmd"] != runs[1]["cmmd"]  # another training seed, the same prompts, noise and reference
    (tmp_path / "d" / REFERENCES).mkdir(parents=True)
    for f in (tmp_path / "a" / REFERENCES).iterdir():
        saved = torch.load(f, weights_only=True)
        saved["features"][0, 0] += 1.0  # one number changed, its sha256 kept: a corrupt copy
        torch.save(saved, tmp_path / "d" / REFERENCES / f.name)
    third = _run(tmp_path / "d")
    assert "(computed)" in third[1]["distribution_reference"]
    assert any("fails its sha256: computed again" in n for n in third[1]["distribution_notes"])
    assert third[-1]["cmmd"] == pytest.approx(first["cmmd"])  # the same seed and reference as the first run
