"""`ablate import`: published curves become a finished grid with the detector's decisions stored."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from sqlalchemy import select

from orchestrator.db.models import Event, Grid, Metric, Run
from orchestrator.db.session import session_scope
from orchestrator.grids.service import GridError
from orchestrator.results.curves import CurvesError, load_curves, parse_curves
from orchestrator.results.importer import CurvesImportError, import_curves

FIXTURE = Path(__file__).parents[2] / "fixtures" / "published_ablation_a_to_d.json"


@pytest.fixture(scope="module")
def imported(database_url: str, ablate_cli) -> int:  # type: ignore[no-untyped-def]
    out = ablate_cli(database_url, "import", str(FIXTURE), "--name", "published A-D")
    assert out.returncode == 0, out.stderr
    assert "B: stopped   collapse @4000  (best 0.9070 @3000)" in out.stdout
    return int(out.stdout.split()[1])


def test_import_stores_runs_metrics_and_b_decision(database_url: str, imported: int, published_curves: dict) -> None:
    with session_scope(database_url) as s:
        grid = s.get(Grid, imported)
        assert grid is not None and grid.source == "imported" and grid.control_arm == "A"
        runs = {r.arm: r for r in grid.runs}
        assert list(runs) == ["A", "B", "C", "D"]
        states = {a: r.state for a, r in runs.items()}
        assert states == {"A": "completed", "B": "stopped", "C": "completed", "D": "completed"}
        b = runs["B"]
        assert (b.decision, b.decision_step, b.best_step) == ("collapse", 4000, 3000)
        assert b.best_value == pytest.approx(0.906958)
        assert "recon_lpips worsened 2 checkpoints" in (b.decision_reason or "")
        for arm in "ACD":
            assert runs[arm].decision == "continue" and runs[arm].decision_step == 5000
        # The spec stored is the arm's resolved spec from arms/ (B = A + TREAD).
        assert b.spec["tread"]["enabled"] is True and b.spec["parent"] == "A"
        assert b.started_at is not None and b.started_at.isoformat().startswith("2026-05-07T16:28:36")

        # Every checkpoint is a metric row: known keys in columns, elapsed_hours as GPU-hours, the rest in extra.
        src = published_curves["B_tread_adamw"]["checkpoints"]
        metrics = s.scalars(select(Metric).where(Metric.run_id == b.id).order_by(Metric.step)).all()
        assert [m.step for m in metrics] == [c["step"] for c in src]
        m, c = metrics[7], src[7]
        assert (m.step, m.recon_lpips, m.text_lpips, m.text_manip_delta) == (
            4000,
            c["recon_lpips"],
            c["text_lpips"],
            c["text_manip_delta"],
        )
        assert (m.gpu_hours, m.iter_per_sec, m.train_loss, m.lr) == (
            c["elapsed_hours"],
            c["iter_per_sec"],
            c["train_loss"],
            c["lr"],
        )
        assert (m.recon_lpips_n, m.text_lpips_n) == (25, 20)
        assert m.recon_lpips_se is None  # the published curves carry no SEs: none invented
        assert m.extra == {"wall_time_iso": c["wall_time_iso"], "vram_allocated_gb": c["vram_allocated_gb"]}

        events = s.scalars(select(Event).where(Event.run_id == b.id, Event.kind == "decision")).all()
        assert len(events) == 1
        assert events[0].data["decision"] == "collapse" and events[0].data["step_flagged"] == 4000
        assert events[0].data["gpu_hours_saved"] > 0 and "ran on to step 5000" in events[0].message
        assert s.scalars(select(Event).where(Event.grid_id == imported, Event.kind == "imported")).all()


def test_import_bad_input_is_one_clear_line(database_url: str, tmp_path: Path, ablate_cli) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "curves.json"
    bad.write_text('{"baseline": {"checkpoints": [{"step": 100, "recon_lpips": 0.9}]}}')
    out = ablate_cli(database_url, "import", str(bad), "--name", "x")
    assert out.returncode == 2
    assert "curve 'baseline': cannot tell which arm" in out.stderr and "--arm baseline=A" in out.stderr
    assert "Traceback" not in out.stderr

    bad.write_text('{"A": {"checkpoints": [{"step": 100, "recon_lpips": "high"}]}}')
    out = ablate_cli(database_url, "import", str(bad), "--name", "x")
    assert out.returncode == 2 and "field 'recon_lpips' must be a number" in out.stderr
    assert "Traceback" not in out.stderr

    curves = parse_curves({"baseline": {"checkpoints": [{"step": 100, "recon_lpips": 0.9}]}})
    with session_scope(database_url) as s, pytest.raises(CurvesImportError, match="unknown arm 'Z'"):
        import_curves(s, curves, "x", arm_map={"baseline": "Z"})
    with pytest.raises(CurvesError, match="not found"):
        load_curves(tmp_path / "missing.json")


def test_import_runs_with_any_token_setting(
    database_url: str, ablate_cli, monkeypatch: pytest.MonkeyPatch  # type: ignore[no-untyped-def]
) -> None:
    """Importing sends the controller's token (ablate_cli names it), so a short one set before for another
    purpose does not stop it."""
    monkeypatch.setenv("ABLATE_API_TOKEN", "short")
    out = ablate_cli(database_url, "import", str(FIXTURE), "--name", "short-token")
    assert out.returncode == 0, out.stderr
    assert "ABLATE_API_TOKEN" not in out.stderr


def test_import_mapping_control_and_divergence(database_url: str) -> None:
    """Curves named freely, mapped with arm_map; a NaN metric is stored and the arm judged diverged."""
    cps = [{"step": s, "recon_lpips": v, "elapsed_hours": s / 100} for s, v in [(100, 0.99), (200, 0.97), (300, 0.95)]]
    bad = [dict(c) for c in cps]
    bad[2]["recon_lpips"] = float("nan")
    bad[1]["note_ratio"] = float("inf")  # an unknown key: kept in extra, as JSON-safe text
    curves = parse_curves({"base": {"checkpoints": cps}, "tread": {"label": "tread run", "checkpoints": bad}})
    with session_scope(database_url) as s:
        grid = import_curves(s, curves, "mapped", control="base", arm_map={"base": "A", "tread run": "B"})
        runs = {r.arm: r for r in grid.runs}
        assert grid.control_arm == "A"
        assert (runs["B"].state, runs["B"].decision, runs["B"].decision_step) == ("stopped", "diverged", 300)
        assert runs["A"].state == "completed"
        gid = grid.id
    with session_scope(database_url) as s:
        b = s.scalars(select(Run).where(Run.grid_id == gid, Run.arm == "B")).one()
        ms = {m.step: m for m in b.metrics}
        # Postgres keeps NaN; SQLite stores it as NULL. Either way the run's decision says diverged.
        v = ms[300].recon_lpips
        assert v is None if database_url.startswith("sqlite") else math.isnan(v)
        assert ms[200].extra == {"note_ratio": "inf"}
    with session_scope(database_url) as s, pytest.raises(CurvesImportError, match="both arm A"):
        import_curves(s, curves, "dup", arm_map={"base": "A", "tread": "A"})
    with session_scope(database_url) as s, pytest.raises(GridError, match="control"):
        import_curves(s, curves, "ctl", control="Q", arm_map={"base": "A", "tread": "B"})
