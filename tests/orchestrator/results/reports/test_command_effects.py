"""A researcher's own trainer gets the verdict machinery: two command arms (the example trainer at two
learning rates, each run for real as a subprocess at seeds 0..2 through the ABLATE_SEED a grid's
`seeds: 3` sets) report `val_loss` with `val_loss_samples`, one loss per held-out item; their records are
stored as ingest stores them, and the report compares the arms on `val_loss` with the crossed seeds x
items interval, checked against a hand computation from the stored lists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.db.models import Grid, Metric, Run
from orchestrator.db.session import session_scope
from orchestrator.grids.service import GridCreate, PathPolicy, create_grid
from orchestrator.results.reports.build import build_report
from orchestrator.runs.ingest import insert_metrics
from tests.kit.crossed_by_hand import crossed_by_hand

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "your-trainer"
ALLOWED = PathPolicy(allow_commands=True, command_dirs=[EXAMPLE])


def arm(name: str, lr: str) -> dict:
    return {"name": name, "code": str(EXAMPLE), "command": [sys.executable, "train.py", "--lr", lr, "--steps", "40",
            "--every", "20"], "detector": {"metric": "val_loss"}}  # fmt: skip


def trained(run: Run, out: Path) -> list[dict]:
    """The example trainer run as the command arm's worker runs it (its env, ABLATE_SEED included)."""
    env = {**os.environ, **run.spec["command"]["env"], "ABLATE_RUN_DIR": str(out)}
    subprocess.run(run.spec["command"]["argv"], cwd=EXAMPLE, env=env, check=True, capture_output=True, timeout=300)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "checkpoint"} for r in records]


@pytest.fixture(scope="module")
def grid_id(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> int:
    body = GridCreate(name="mine", arms=[arm("slow", "3e-4"), arm("fast", "3e-3")], control="slow", seeds=3)
    with session_scope(database_url) as session:
        grid = create_grid(session, body, paths=ALLOWED)
        for run in grid.runs:
            insert_metrics(session, run.id, trained(run, tmp_path_factory.mktemp(f"{run.arm}-{run.seed}")))
            run.state = "completed"
        return grid.id


def test_command_arms_with_item_lists_get_the_crossed_interval(database_url: str, grid_id: int) -> None:
    with session_scope(database_url) as session:
        grid = session.get(Grid, grid_id)
        report = build_report(session, grid)
        runs = {(r.arm, r.seed): r for r in grid.runs}
        assert runs[("fast", 1)].spec["command"]["env"]["ABLATE_SEED"] == "1"

        def final(arm: str, seed: int) -> list[float]:
            rows = session.query(Metric).filter(Metric.run_id == runs[(arm, seed)].id).order_by(Metric.step)
            return rows.all()[-1].extra["val_loss_samples"]

        table = [[f - s for f, s in zip(final("fast", k), final("slow", k), strict=True)] for k in range(3)]
    effect = next(e for e in report.effects if (e.arm, e.metric) == ("fast", "val_loss"))
    hand = crossed_by_hand(table)
    assert effect.against == "control" and effect.k == 3 and effect.n == 512 and effect.interval == "crossed"
    assert effect.diff == pytest.approx(hand["mean"]) and effect.df == pytest.approx(hand["df"])
    assert (effect.low, effect.high) == (pytest.approx(hand["low"]), pytest.approx(hand["high"]))
    assert effect.budget is not None and effect.budget.seeds + effect.budget.images + effect.budget.rest == (
        pytest.approx(1))
    # The seeds differ in training: their per-seed differences are not all the same.
    assert len({round(s.diff, 12) for s in effect.per_seed}) == 3
    assert effect.reading != "no interval"
