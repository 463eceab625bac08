"""The dashboard's paired difference against the control arm: per-sample pairs when the worker stored
them, else the two arms' SEs combined (labelled), else none."""

from __future__ import annotations

import math

import pytest

from orchestrator.dashboard.data import paired_difference
from orchestrator.db.models import Metric
from orchestrator.runs.ingest import metric_values
from orchestrator.runs.samples import sample_index


def _checkpoint(step: int, samples: list[float] | None, se: float | None = 0.02) -> Metric:
    record = {"step": step, "recon_lpips": sum(samples) / len(samples) if samples else 0.5, "recon_lpips_se": se}
    if samples is not None:
        record["recon_lpips_samples"] = samples  # as evaluate() reports them
    return Metric(step=step, **metric_values(record))


def test_per_sample_values_give_a_paired_se() -> None:
    control = [_checkpoint(10, [0.50, 0.60, 0.70, 0.80])]
    arm = [_checkpoint(10, [0.49, 0.58, 0.69, 0.78])]  # better on every sample, by about the same amount
    p = paired_difference(arm, control, "recon_lpips")
    d = [-0.01, -0.02, -0.01, -0.02]
    mean = sum(d) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 3)
    assert p["se_method"] == "paired" and p["step"] == [10]
    assert p["diff"] == [pytest.approx(mean)] and p["se"] == [pytest.approx(sd / 2)]
    assert p["se"][0] < math.sqrt(2 * 0.02**2) / 5  # far tighter than treating the arms as independent


def test_without_samples_the_se_is_the_independent_bound_or_none() -> None:
    independent = paired_difference([_checkpoint(10, None)], [_checkpoint(10, None)], "recon_lpips")
    assert independent["se_method"] == "independent" and independent["se"] == [pytest.approx(math.sqrt(2) * 0.02)]
    none = paired_difference([_checkpoint(10, None, se=None)], [_checkpoint(10, None, se=None)], "recon_lpips")
    assert none["se_method"] == "none" and none["se"] == [None]


def test_the_gallery_index_lists_steps_with_images_and_the_newest_set() -> None:
    def manifest(*names: str) -> dict:
        files = [{"file": n, "kind": n.split("_")[0], "index": 0, "caption": "a red square", "bytes": 9} for n in names]
        return {"samples": {"dir": "x", "max_side": 128, "files": files}}

    records = [
        (10, manifest("target_0.png", "recon_0.png")),
        (20, None),  # a checkpoint recorded without images (an imported curve)
        (30, {"other": 1}),
        (40, manifest("target_0.png", "recon_0.png", "text_0.png", "best.pt", "../x_0.png")),
    ]
    index = sample_index(records)
    assert index.steps == [10, 40]
    # The newest step's set, and only names the API serves.
    assert [(f.file, f.kind, f.index, f.caption) for f in index.files] == [
        ("target_0.png", "target", 0, "a red square"),
        ("recon_0.png", "recon", 0, "a red square"),
        ("text_0.png", "text", 0, "a red square"),
    ]
    assert sample_index([(10, None)]).model_dump() == {"steps": [], "files": []}
