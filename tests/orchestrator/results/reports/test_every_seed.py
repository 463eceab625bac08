"""Every seed counts: where a comparison's two arms ran different seeds (a deciding grid adds seeds to the
control for one comparison), its effect reads every seed of both, by the unpaired crossed interval
(crossed.py `unpaired_components`), not only the seeds the two share. A grid of two command arms whose
records are stored as ingest stores them: the control on three seeds, the arm on two."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy.orm import Session

from orchestrator.db.models import Grid, Metric
from orchestrator.db.session import session_scope
from orchestrator.grids.service import GridCreate, PathPolicy, create_grid
from orchestrator.results.reports.build import build_report, grid_effects_now
from orchestrator.results.reports.crossed import unpaired_components
from orchestrator.runs.ingest import insert_metrics

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "your-trainer"
ALLOWED = PathPolicy(allow_commands=True, command_dirs=[EXAMPLE])
N = 24
STEP = 40


def arm(name: str) -> dict:
    return {"name": name, "code": str(EXAMPLE), "command": [sys.executable, "train.py"],
            "detector": {"metric": "val_loss"}}  # fmt: skip


def values() -> dict[tuple[str, int], list[float]]:
    """Per-item losses: the items' own difficulty common to both arms, each seed its offset, and noise (the
    control's third seed well off the other two, so leaving it out shows)."""
    rng = np.random.default_rng(56)
    items = rng.normal(1.0, 0.05, N)
    offsets = {"slow": (0.0, 0.004, 0.02), "fast": (-0.02, -0.015)}
    return {(name, s): (items + offset + rng.normal(0, 0.004, N)).tolist()
            for name, seeds in offsets.items() for s, offset in enumerate(seeds)}


@pytest.fixture(scope="module")
def grid_id(database_url: str) -> int:
    body = GridCreate(name="every seed", arms=[arm("slow"), arm("fast")], control="slow", seeds=3)
    with session_scope(database_url) as session:
        grid = create_grid(session, body, paths=ALLOWED)
        table = values()
        for run in grid.runs:
            row = table.get((run.arm, run.seed))
            if row is None:  # the arm's third seed was never run
                run.state = "failed"
                continue
            insert_metrics(session, run.id, [{"step": STEP, "val_loss": sum(row) / N, "val_loss_samples": row}])
            run.state = "completed"
        return grid.id


def test_the_control_s_extra_seed_enters_the_effect(database_url: str, grid_id: int) -> None:
    table = values()
    arm_rows = [table[("fast", s)] for s in range(2)]
    control_rows = [table[("slow", s)] for s in range(3)]
    with session_scope(database_url) as session:
        report = build_report(session, session.get(Grid, grid_id))
        _, live = grid_effects_now(session.get(Grid, grid_id), _metrics(session, grid_id))
    effect = next(e for e in report.effects if (e.arm, e.metric) == ("fast", "val_loss"))
    # The difference of the two arms' means over all their seeds: the control's third seed is in it.
    expected = np.mean(arm_rows) - np.mean(control_rows)
    paired_only = np.mean(arm_rows) - np.mean(control_rows[:2])
    assert effect.diff == pytest.approx(expected) and abs(expected - paired_only) > 1e-4
    comp = unpaired_components(arm_rows, control_rows)
    assert comp is not None and comp.sides == (2, 3)
    assert effect.se == pytest.approx(comp.variance() ** 0.5) and effect.interval == "crossed"
    assert effect.k == 2 and effect.n == N
    assert "fast k=2, slow k=3: every seed, unpaired" in effect.noise
    assert [s.seed for s in effect.per_seed] == [0, 1]  # the appendix stays the paired seeds'
    # The decider reads the same effect (grid_effects_now), so a look sees every seed too.
    live_effect = next(e for e in live if (e.arm, e.metric) == ("fast", "val_loss"))
    assert live_effect.diff == pytest.approx(expected) and live_effect.se == pytest.approx(effect.se)


def _metrics(session: Session, grid_id: int) -> dict[int, list[Metric]]:
    grid = session.get(Grid, grid_id)
    out: dict[int, list] = {r.id: [] for r in grid.runs}
    for m in session.query(Metric).filter(Metric.run_id.in_(list(out))).order_by(Metric.step):
        out[m.run_id].append(m)
    return out
