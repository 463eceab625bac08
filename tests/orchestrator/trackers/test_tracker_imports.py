"""`ablate import` from a tracker: the published A-D study written by each tracker's own client (TensorBoard's
writer, W&B offline) or as W&B's CSV exports, imported, and judged as the curves JSON is: B stopped at 4000."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from orchestrator.db.models import Grid, Metric, Run
from orchestrator.db.session import session_scope
from orchestrator.results.curves import CurvesError
from orchestrator.trackers.exports import tracker_export_curves

NUMERIC = ("recon_lpips", "text_lpips", "text_manip_delta", "train_loss", "lr", "iter_per_sec")
B_STOPPED = "B: stopped   collapse @4000  (best 0.9070 @3000)"


def numbers(checkpoint: dict[str, Any]) -> dict[str, float]:
    return {k: checkpoint[k] for k in NUMERIC if checkpoint.get(k) is not None}


def imported_grid(database_url: str, ablate_cli: Any, path: Path, name: str) -> tuple[int, str]:  # noqa: ANN401
    out = ablate_cli(database_url, "import", str(path), "--name", name)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[1]), out.stdout


def assert_same_study(database_url: str, grid_id: int, published: dict) -> None:
    with session_scope(database_url) as s:
        runs = s.scalars(select(Run).where(Run.grid_id == grid_id).order_by(Run.position)).all()
        assert [r.arm for r in runs] == ["A", "B", "C", "D"]
        assert s.get_one(Grid, grid_id).source == "imported"
        for run, body in zip(runs, published.values(), strict=True):
            stored = s.scalars(select(Metric).where(Metric.run_id == run.id).order_by(Metric.step)).all()
            assert [(m.step, m.recon_lpips) for m in stored] == [
                (cp["step"], pytest.approx(cp["recon_lpips"])) for cp in body["checkpoints"]
            ]
        assert [(r.state, r.decision_step) for r in runs][1] == ("stopped", 4000)


def test_tensorboard_event_files_import_as_the_study(
    database_url: str, tmp_path: Path, ablate_cli: Any, published_curves: dict  # noqa: ANN401
) -> None:
    from torch.utils.tensorboard import SummaryWriter

    for key, body in published_curves.items():  # one folder per arm, metrics under a prefix as many loggers do
        with SummaryWriter(log_dir=str(tmp_path / "logs" / key)) as writer:
            for cp in body["checkpoints"]:
                for name, value in numbers(cp).items():
                    writer.add_scalar(f"eval/{name}", value, cp["step"])
    grid_id, stdout = imported_grid(database_url, ablate_cli, tmp_path / "logs", "from tensorboard")
    assert B_STOPPED in stdout
    assert_same_study(database_url, grid_id, published_curves)


def test_wandb_offline_runs_import_as_the_study(
    database_url: str, tmp_path: Path, ablate_cli: Any, published_curves: dict, monkeypatch: pytest.MonkeyPatch  # noqa: ANN401
) -> None:
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for key, body in published_curves.items():
        run = wandb.init(project="study", dir=str(tmp_path), name=key, reinit="create_new",
                         settings=wandb.Settings(console="off", x_disable_stats=True))  # fmt: skip
        for cp in body["checkpoints"]:
            run.log(numbers(cp), step=cp["step"])
        run.finish()
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 4
    grid_id, stdout = imported_grid(database_url, ablate_cli, tmp_path / "wandb", "from wandb offline")
    assert B_STOPPED in stdout
    assert_same_study(database_url, grid_id, published_curves)


def test_wandb_csv_exports_import_a_chart_of_several_runs_and_one_runs_history(
    database_url: str, tmp_path: Path, ablate_cli: Any, published_curves: dict  # noqa: ANN401
) -> None:
    # A chart's export: Step, then "<run> - <metric>" with W&B's __MIN/__MAX columns beside each.
    chart = tmp_path / "chart.csv"
    columns = ["Step"] + [f"{key} - recon_lpips{s}" for key in published_curves for s in ("", "__MIN", "__MAX")]
    steps = sorted({cp["step"] for body in published_curves.values() for cp in body["checkpoints"]})
    with chart.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, columns)
        writer.writeheader()
        for step in steps:
            row: dict[str, Any] = {"Step": step}
            for key, body in published_curves.items():
                value = next((cp["recon_lpips"] for cp in body["checkpoints"] if cp["step"] == step), "")
                row |= {f"{key} - recon_lpips": value, f"{key} - recon_lpips__MIN": 0, f"{key} - recon_lpips__MAX": 9}
            writer.writerow(row)
    grid_id, stdout = imported_grid(database_url, ablate_cli, chart, "from a wandb chart")
    assert B_STOPPED in stdout
    assert_same_study(database_url, grid_id, published_curves)

    # One run's history export: _step, W&B's own columns, and the metrics; the file names the run.
    history = tmp_path / "B_tread_adamw.csv"
    with history.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, ["_step", "_runtime", "_timestamp", *NUMERIC])
        writer.writeheader()
        for cp in published_curves["B_tread_adamw"]["checkpoints"]:
            writer.writerow({"_step": cp["step"], "_runtime": 1.0, "_timestamp": 1.7e9, **numbers(cp)})
    (curve,) = tracker_export_curves(history).values()
    assert curve.label == "B_tread_adamw"
    assert [cp.step for cp in curve.checkpoints] == [cp["step"] for cp in published_curves["B_tread_adamw"][
        "checkpoints"]]  # fmt: skip
    assert curve.raw[0]["text_manip_delta"] == pytest.approx(0.350759) and "_runtime" not in curve.raw[0]


def test_a_file_that_is_no_export_is_one_clear_line(database_url: str, tmp_path: Path, ablate_cli: Any) -> None:  # noqa: ANN401
    bad = tmp_path / "export.csv"
    bad.write_text("epoch,loss\n1,0.5\n")
    out = ablate_cli(database_url, "import", str(bad), "--name", "x")
    assert out.returncode == 2 and "not a W&B CSV export" in out.stderr and "Traceback" not in out.stderr
    damaged = tmp_path / "run-x.wandb"
    damaged.write_bytes(b":W&B\xe1\xbe\x00" + os.urandom(64))
    with pytest.raises(CurvesError, match="damaged record"):
        tracker_export_curves(damaged)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CurvesError, match="neither W&B runs"):
        tracker_export_curves(empty)
