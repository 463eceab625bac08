"""`ablate demo`'s embedded defaults: its grid, its LPIPS choice, its settings and its tables (the full run
is the Quickstart's first command, tests/orchestrator/test_demo_e2e.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rich.console import Console

from orchestrator.cli.demo import _progress_table, demo_grid, demo_lpips, demo_settings, summary_table
from orchestrator.grids.service import GridCreate, resolve_grid
from orchestrator.settings import Settings


@pytest.fixture
def empty_torch_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    return tmp_path / "torch_home"


def test_demo_grid_is_a_to_d_and_an_arm_whose_lr_is_too_high(
    monkeypatch: pytest.MonkeyPatch, empty_torch_home: Path
) -> None:
    monkeypatch.delenv("ABLATE_DATABASE_URL", raising=False)
    settings = demo_settings(Settings(home_dir=Path("/tmp/x")))
    backbone, line = demo_lpips(settings)  # offline (tests), nothing cached: the labelled stand-in
    assert backbone == "random_standin" and "ABLATE_OFFLINE" in line
    arms = dict(resolve_grid(GridCreate(**demo_grid(backbone))))
    assert list(arms) == ["A", "B", "C", "D", "A-lr500x"]
    for spec in arms.values():
        assert spec.model.size == "tiny" and spec.data.dataset == "shapes" and spec.schedule.steps == 400
        assert spec.eval.lpips_backbone == "random_standin"
    # the broken arm is A under the grid's overrides, plus its own lr jump (which the overrides must not drop)
    hot, a = arms["A-lr500x"], arms["A"]
    assert (hot.schedule.lr_explode_after, hot.schedule.lr_explode_factor) == (100, 500)
    assert (a.schedule.lr_explode_after, a.schedule.lr, a.schedule.warmup_steps) == (None, 2e-3, 30)
    jump = {"lr_explode_after", "lr_explode_factor"}
    assert hot.schedule.model_dump(exclude=jump) == a.schedule.model_dump(exclude=jump)
    assert hot.model_dump(exclude={"name", "parent", "description", "schedule"}) == a.model_dump(
        exclude={"name", "parent", "description", "schedule"}
    )
    assert settings.database_url == "sqlite:////tmp/x/demo.db" and settings.logical_gpus == len(arms)


def test_demo_uses_real_lpips_when_weights_are_given(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = demo_settings(Settings(lpips_weights=Path("/w/alexnet.pth"), ray_address="auto"))
    backbone, line = demo_lpips(settings)
    assert backbone == "alexnet" and "/w/alexnet.pth" in line
    arms = resolve_grid(GridCreate(**demo_grid(backbone)))
    assert {spec.eval.lpips_backbone for _, spec in arms} == {"alexnet"}
    assert settings.logical_gpus == 0, "a real cluster's GPUs are not overridden"


def test_demo_uses_real_lpips_when_torchvision_has_the_weights_cached(empty_torch_home: Path) -> None:
    from model.perceptual import import_torchvision

    cached = empty_torch_home / "hub/checkpoints/alexnet-owt-7be5be79.pth"
    cached.parent.mkdir(parents=True)
    torch.save(import_torchvision().models.alexnet(weights=None).state_dict(), cached)
    backbone, line = demo_lpips(demo_settings(Settings(home_dir=Path("/tmp/x"))))
    assert backbone == "alexnet" and str(cached) in line


def _text(renderable: object) -> str:
    console = Console(record=True, width=250)
    console.print(renderable)
    return console.export_text()


ROWS = [
    {"arm": "A", "gpu": "0", "state": "completed", "decision": "continue", "decision_step": None,
     "detector_stop": False, "first": 0.12, "first_step": 50, "best": 0.048, "best_se": 0.009, "best_step": 400,
     "best_checkpoint": "/r/1/best.pt", "final": 0.048, "iter_s": 9.0, "hours_saved": None, "steps": 400,
     "step": 400, "reason": None},
    {"arm": "A-lr500x", "gpu": "4", "state": "stopped", "decision": "diverged", "decision_step": 150,
     "detector_stop": True, "first": 0.12, "first_step": 50, "best": 0.113, "best_se": 0.023, "best_step": 100,
     "best_checkpoint": "/r/5/best.pt", "final": float("nan"), "iter_s": 9.0, "hours_saved": 0.0056, "steps": 400,
     "step": 150, "reason": "recon_lpips=nan, train_loss=nan, grad_norm=nan at step 150"},
]


def test_the_tables_show_the_detectors_stop_its_reason_kept_checkpoint_and_hours_saved() -> None:
    final = _text(summary_table(ROWS))
    assert "stopped / diverged @150" in final and "0.0056 (20 s)" in final and "CPU-h saved" in final
    live = _text(_progress_table(ROWS, 30.0, "http://x/"))
    assert "stopped (diverged @150)" in live and "0.0056 (20 s)" in live
    assert "kept its best checkpoint, step 100: /r/5/best.pt" in live
    assert "reason: recon_lpips=nan, train_loss=nan, grad_norm=nan at step 150" in live
    assert "A stopped" not in live  # the arm that completed has no stop line
