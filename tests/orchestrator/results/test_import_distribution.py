"""`ablate import` of PRX-style curves: FID, CMMD and DINO-MMD columns become the grid's fid, cmmd and dino_mmd
per checkpoint, labelled as imported, and the detector may replay the study on CMMD."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from orchestrator.db.models import Grid, Metric
from orchestrator.db.session import session_scope
from orchestrator.results.curves import CurvesError
from orchestrator.runs.ingest import metric_series
from orchestrator.trackers.exports import tracker_export_curves

PRX = Path(__file__).parents[2] / "fixtures" / "prx_style_curves.csv"


def test_prx_curves_import_with_their_distribution_metrics_and_replay_on_cmmd(
    database_url: str, tmp_path: Path, ablate_cli: Any  # noqa: ANN401 - the conftest's runner
) -> None:
    policy = tmp_path / "cmmd.yaml"
    policy.write_text("metric: cmmd\n")
    out = ablate_cli(database_url, "import", str(PRX), "--name", "prx", "--policy", str(policy))
    assert out.returncode == 0, out.stderr
    # B's CMMD is best at 60k (0.55), then worse at 70k and 80k by more than margin_abs: stopped at 80k
    assert "B: stopped   collapse @80000  (best 0.5500 @60000)" in out.stdout
    assert "A: completed continue @100000  (best 0.4100 @100000)" in out.stdout
    grid_id = int(out.stdout.split()[1])
    with session_scope(database_url) as session:
        runs = {r.arm: r for r in session.get_one(Grid, grid_id).runs}
        last = session.scalar(select(Metric).where(Metric.run_id == runs["A"].id, Metric.step == 100000))
        assert last is not None
        assert {k: last.extra[k] for k in ("fid", "cmmd", "dino_mmd")} == {"fid": 18.2, "cmmd": 0.41, "dino_mmd": 0.39}
        assert last.extra["cmmd_extractor"] == "as published (imported)"
        series = metric_series(session, runs["B"].id)
        assert [p["step"] for p in series] == list(range(10000, 100001, 10000))
        assert series[5]["cmmd"] == 0.55 and series[5]["cmmd_extractor"] == "as published (imported)"


def test_a_wandb_chart_of_prx_metrics_names_them_as_ablate_does(tmp_path: Path) -> None:
    chart = tmp_path / "chart.csv"
    chart.write_text("Step,A_baseline - eval/CMMD,A_baseline - DINO-MMD,A_baseline - FID\n10000,1.62,1.80,60.1\n")
    curves = tracker_export_curves(chart)
    assert curves is not None
    assert dict(curves["A_baseline"].raw[0]) == {"step": 10000, "cmmd": 1.62, "dino_mmd": 1.8, "fid": 60.1}


@pytest.mark.parametrize(
    ("text", "needle"),
    [("run,step,CMMD\n,10000,0.4\n", "line 2: the run column is empty"),
     ("run,step,CMMD\nA,ten,0.4\n", "line 2: step must be a non-negative integer, got 'ten'")],
)  # fmt: skip
def test_a_bad_row_of_a_table_of_runs_is_one_line_naming_it(tmp_path: Path, text: str, needle: str) -> None:
    bad = tmp_path / "prx.csv"
    bad.write_text(text)
    with pytest.raises(CurvesError, match=needle):
        tracker_export_curves(bad)
