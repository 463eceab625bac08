"""Issue 63, finding 1: the reference features a distribution evaluation scores against were taken on their own
word. Any node running a distribution pass may write `<store root>/references/<key>.pt`, and the file's own
sha256 proved only that the file was whole, so a stranger that rewrote it moved every other node's CMMD.

A real reproduction on the CPU: a tiny run trained with CMMD, evaluated by a trusted node through a file://
store (which publishes the reference), the store's file then rewritten by a stranger (other features, their
own sha256 beside them), and the checkpoint evaluated again by an honest node that has no copy of its own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model.extractors import WEIGHTS_DIR_ENV
from tests.worker.test_train import spec_for
from worker.evaluation import evaluate_arm
from worker.reference_keys import reference_key
from worker.references import REFERENCES, features_sha
from worker.train import train_arm

SAMPLES = 16


@pytest.fixture(autouse=True)
def no_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WEIGHTS_DIR_ENV, str(tmp_path / "no-weights"))  # offline: the small stand-ins


def _evaluate(spec, run: Path, store: Path, node: Path, pins: dict[str, str] | None = None) -> dict:  # noqa: ANN001
    """The evaluation job's record on `node` (its own directory: its reference cache lies there)."""
    evaluation = {"step": 4, "source_dir": str(run), "images": 4, "storage": {"url": f"file://{store}/run-1"},
                  "samples": SAMPLES, "metrics": ["cmmd"], "reference_pins": pins or {}}  # fmt: skip
    (record,) = evaluate_arm(spec, node, evaluation=evaluation)
    return record


def test_a_strangers_rewritten_store_reference_is_never_scored_against(tmp_path: Path) -> None:
    spec = spec_for("A", data={"held_out": SAMPLES, "split_seed": 7}, schedule={"steps": 4, "checkpoint_every": 4})
    run, store = tmp_path / "run", tmp_path / "store"
    list(train_arm(spec, run))
    trusted = _evaluate(spec, run, store, tmp_path / "trusted")
    ((label, pinned),) = trusted["distribution_sha256"].items()
    assert "(computed)" in trusted["distribution_reference"]
    key = reference_key(label, spec)
    published = store / REFERENCES / f"{key}.pt"
    assert published.is_file()  # the trusted node shared its features through the store

    saved = torch.load(published, weights_only=True)  # the stranger: other features, their own sha256 beside them
    forged = saved["features"] + 0.5
    torch.save({"features": forged, "sha256": features_sha(forged)}, published)

    honest = _evaluate(spec, run, store, tmp_path / "honest", pins={key: pinned})
    assert honest["distribution_sha256"] == {label: pinned}  # scored against the pinned features, not the file's
    assert honest["cmmd"] == pytest.approx(trusted["cmmd"])
    assert any("not the features the controller pinned" in n for n in honest["distribution_notes"])
    assert torch.load(published, weights_only=True)["sha256"] == pinned  # and the store's copy put right

    torch.save({"features": forged, "sha256": features_sha(forged)}, published)
    unpinned = _evaluate(spec, run, store, tmp_path / "unpinned")  # no pin yet: the store's copy is not read
    assert "(computed)" in unpinned["distribution_reference"]
    assert unpinned["distribution_sha256"] == {label: pinned} and unpinned["cmmd"] == pytest.approx(trusted["cmmd"])

    pinned_copy = _evaluate(spec, run, store, tmp_path / "reader", pins={key: pinned})
    assert "(store)" in pinned_copy["distribution_reference"]  # the pinned features, shared through the store
    assert pinned_copy["distribution_sha256"] == {label: pinned}
