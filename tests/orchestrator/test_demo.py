"""`ablate demo`'s embedded defaults: its grid and its settings (the full run is the Quickstart's first command)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli.demo import demo_grid, demo_settings, summary_table
from orchestrator.grids import GridCreate, resolve_grid
from orchestrator.settings import Settings


def test_demo_grid_is_arms_a_to_d_tiny_on_shapes_with_a_labelled_standin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ABLATE_DATABASE_URL", raising=False)
    settings = demo_settings(Settings(storage_dir=Path("/tmp/x")))
    arms = resolve_grid(GridCreate(**demo_grid(settings)))
    assert [label for label, _ in arms] == ["A", "B", "C", "D"]
    for _, spec in arms:
        assert spec.model.size == "tiny" and spec.data.dataset == "shapes"
        assert spec.eval.lpips_backbone == "random_standin"
    assert settings.database_url == "sqlite:////tmp/x/demo.db" and settings.logical_gpus == 4


def test_demo_uses_real_lpips_when_weights_are_given(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = demo_settings(Settings(lpips_weights=Path("/w/alexnet.pth"), ray_address="auto"))
    arms = resolve_grid(GridCreate(**demo_grid(settings)))
    assert {spec.eval.lpips_backbone for _, spec in arms} == {"alexnet"}
    assert settings.logical_gpus == 0, "a real cluster's GPUs are not overridden"


def test_summary_table_has_one_row_per_arm() -> None:
    row = {"arm": "B", "gpu": "1", "state": "stopped", "decision": "collapse", "first": 0.12, "first_step": 50,
           "best": 0.048, "best_se": 0.009, "best_step": 350, "final": 0.07, "iter_s": 9.0}
    table = summary_table([row])
    assert table.row_count == 1 and "best recon LPIPS ± SE" in [c.header for c in table.columns]
