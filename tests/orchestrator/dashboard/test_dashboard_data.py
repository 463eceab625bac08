"""The dashboard's data: the paired difference against the control arm (per-sample pairs when the worker
stored them, else the two arms' SEs combined, labelled, else none), the gallery's index, and how each
arm's data fed its GPU (data wait flagged above 10% with the fix, micro-batch x accumulation, skipped
images over resumed segments)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from orchestrator.dashboard.data import grid_detail, paired_difference
from orchestrator.db.models import Metric
from orchestrator.db.session import session_scope
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.results.data_feed import DATA_WAIT_FIX, DATA_WAIT_LIMIT, data_feed
from orchestrator.results.samples import sample_index
from orchestrator.runs.ingest import ingest, metric_values


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
    assert sample_index([(10, None)]).model_dump() == {"steps": [], "files": [], "malformed": []}


def _fed(step: int, wait: float | None, skipped: Sequence[int] = (), resumed: int | None = None) -> dict:
    """A checkpoint record's data fields as worker/train_record.py writes them (skipped: which bad files)."""
    return {
        "step": step, "recon_lpips": 0.5, "data_wait_fraction": wait, "micro_batch": 8, "grad_accum": 32,
        "loader_workers": 3, "skipped_images": len(skipped), "skipped_files": [f"bad{i}.jpg" for i in skipped][:10],
        "resumed_from_step": resumed,
    }  # fmt: skip


def test_data_wait_is_flagged_above_ten_percent_with_the_fix() -> None:
    def feed(*records: dict) -> object:
        return data_feed([(r["step"], metric_values(r)["extra"]) for r in records])

    slow = feed(_fed(10, 0.02), _fed(20, 0.31))  # the newest checkpoint counts, not the worst
    assert slow.waiting and slow.wait_fraction == pytest.approx(0.31)
    assert slow.fix == DATA_WAIT_FIX and "ablate data prepare" in slow.fix and "data.loader_workers" in slow.fix
    assert (slow.micro_batch, slow.grad_accum, slow.loader_workers) == (8, 32, 3)
    recovered = feed(_fed(10, 0.31), _fed(20, 0.02))
    assert not recovered.waiting and recovered.fix is None
    at_limit = feed(_fed(10, DATA_WAIT_LIMIT))  # "more than 10%": 10% itself is fine
    assert not at_limit.waiting
    unmeasured = feed(_fed(10, None))  # no timed steps in the window: no figure, no flag
    assert unmeasured.wait_fraction is None and not unmeasured.waiting
    assert data_feed([]).model_dump() == {
        "wait_fraction": None, "micro_batch": None, "grad_accum": None, "loader_workers": None,
        "skipped_images": 0, "skipped_files": [], "waiting": False, "fix": None,
    }  # fmt: skip


def test_skipped_images_are_counted_once_over_resumed_segments() -> None:
    def feed(*records: dict) -> object:
        return data_feed([(r["step"], metric_values(r)["extra"]) for r in records])

    # Segment 1 skips files 0 and 1; the resumed worker (from step 20) counts afresh and meets 0 again, then 2.
    resumed = feed(_fed(10, 0.01, [0]), _fed(20, 0.01, [0, 1]), _fed(30, 0.01, [0], 20), _fed(40, 0.01, [0, 2], 20))
    assert resumed.skipped_images == 3 and resumed.skipped_files == ["bad0.jpg", "bad1.jpg", "bad2.jpg"]
    # A segment that skipped more than the ten a record names: its count is a floor for the run's.
    many = feed(_fed(10, 0.01, list(range(14))), _fed(20, 0.01, [20], 10))
    assert many.skipped_images == 14 and len(many.skipped_files) == 10


def test_grid_detail_carries_each_arms_data_feed(database_url: str) -> None:
    with session_scope(database_url) as s:
        grid = create_grid(s, GridCreate(name="data feed", arms=["A", "B"], overrides={"model": {"size": "tiny"}}))
        a, b = grid.runs
        ingest(s, a, [_fed(10, 0.04), _fed(20, 0.03)], detect=False)
        ingest(s, b, [_fed(10, 0.42, [3, 4])], detect=False)
        s.flush()
        rows = {r["arm"]: r["data"] for r in grid_detail(s, grid)["runs"]}
    assert rows["A"]["waiting"] is False and rows["A"]["wait_fraction"] == pytest.approx(0.03)
    assert rows["A"]["skipped_images"] == 0
    assert rows["B"]["waiting"] is True and rows["B"]["fix"] == DATA_WAIT_FIX
    assert (rows["B"]["micro_batch"], rows["B"]["grad_accum"], rows["B"]["skipped_images"]) == (8, 32, 2)


def _flow(step: int, loss: list[float], backbone: str) -> dict:
    """A checkpoint as the trainer writes it: val_flow_loss with per-image values and per-time means."""
    mean = sum(loss) / len(loss)
    return {"step": step, "recon_lpips": 0.5, "lpips_backbone": backbone, "val_flow_loss": mean,
            "val_flow_loss_se": 0.01, "val_flow_loss_n": len(loss), "val_flow_loss_samples": loss,
            "val_flow_loss_by_t": [mean + 0.1 * k for k in range(8)],
            "val_flow_loss_t": [(k + 0.5) / 8 for k in range(8)]}  # fmt: skip


def test_grid_detail_pairs_the_flow_loss_names_the_judge_and_keeps_the_per_time_means(database_url: str) -> None:
    """Stand-in LPIPS: the dashboard says the flow headline (val_flow_ivw) judges; the loss's paired difference
    against the control uses the per-image values; the per-time means of every checkpoint are there to draw."""
    with session_scope(database_url) as s:
        grid = create_grid(s, GridCreate(name="flow", arms=["A", "B"], overrides={"model": {"size": "tiny"}}))
        a, b = grid.runs
        ingest(s, a, [_flow(10, [0.50, 0.60, 0.70, 0.80], "random_standin"), _flow(20, [0.4] * 4, "random_standin")],
               detect=False)  # fmt: skip
        ingest(s, b, [_flow(10, [0.52, 0.63, 0.71, 0.83], "alexnet")], detect=False)
        s.flush()
        rows = {r["arm"]: r for r in grid_detail(s, grid)["runs"]}
    assert rows["A"]["judge_metric"] == "val_flow_ivw" and rows["B"]["judge_metric"] == "recon_lpips"
    paired = rows["B"]["paired"]["val_flow_loss"]
    d = [0.02, 0.03, 0.01, 0.03]
    mean = sum(d) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 3)
    assert paired["se_method"] == "paired" and paired["step"] == [10]
    assert paired["diff"] == [pytest.approx(mean)] and paired["se"] == [pytest.approx(sd / 2)]
    by_t = rows["A"]["flow_by_t"]
    assert by_t["step"] == [10, 20] and by_t["t"] == [(k + 0.5) / 8 for k in range(8)]
    assert by_t["by_t"][1] == pytest.approx([0.4 + 0.1 * k for k in range(8)])
    assert rows["A"]["series"]["val_flow_loss_se"] == [0.01, 0.01]
