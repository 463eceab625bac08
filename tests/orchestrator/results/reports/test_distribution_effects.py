"""CMMD in the report: its per-sample values pair arm and control sample by sample, so its effect across seeds
gets the crossed seeds x samples interval over n samples; the effect and every comparison name the extractor;
a stand-in extractor's numbers are shown but never called better or worse. Records stored as ingest stores
them (the trainer's keys: cmmd, _se, _n, _extractor, _samples)."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.db.models import Evaluation, EvaluationResult, Grid
from orchestrator.db.session import session_scope
from orchestrator.fleet.inventory import LOCAL
from orchestrator.grids.evaluations import ASKED
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.results.reports.build import build_report
from orchestrator.results.reports.render import to_json, to_markdown
from orchestrator.runs.ingest import insert_metrics

N, STEP = 32, 20
REAL, STANDIN = "clip-vit-l-14-336", "clip-vit-l-14-336 small random stand-in (no weights)"


def _arm(name: str) -> dict:
    return {"parent": "A", "name": name, "eval": {"distribution": {"metrics": ["cmmd"], "samples": N}}}


def _grid(database_url: str, label: str) -> int:
    """worse: +0.5 on every sample over the control (per-sample SD 0.1, seeds' offsets 0.02)."""
    rng = np.random.default_rng(58)
    items = rng.normal(1.0, 0.3, N)  # each sample's own difficulty, common to both arms (same prompt and noise)
    with session_scope(database_url) as session:
        grid = create_grid(session, GridCreate(name=f"cmmd {label}", arms=[_arm("base"), _arm("worse")],
                                               control="base", seeds=2))  # fmt: skip
        for run in grid.runs:
            shift = 0.5 if run.arm == "worse" else 0.0
            values = (items + shift + rng.normal(0, 0.02) + rng.normal(0, 0.1, N)).tolist()
            insert_metrics(session, run.id, [{"step": STEP, "cmmd": float(np.mean(values)), "cmmd_n": N,
                                              "cmmd_se": float(np.std(values, ddof=1) / N**0.5),
                                              "cmmd_extractor": label, "cmmd_samples": values}])  # fmt: skip
            run.state = "completed"
        return grid.id


@pytest.mark.parametrize("label", [REAL, STANDIN])
def test_cmmd_effect_is_crossed_over_its_samples_and_a_standin_is_descriptive(database_url: str, label: str) -> None:
    grid_id = _grid(database_url, label)
    with session_scope(database_url) as session:
        report = build_report(session, session.get(Grid, grid_id))
    effect = next(e for e in report.effects if (e.arm, e.metric, e.against) == ("worse", "cmmd", "control"))
    assert effect.interval == "crossed" and effect.k == 2 and effect.n == N
    assert effect.low is not None and effect.high is not None and 0 < effect.low < 0.5 < effect.high
    assert effect.extractor == label
    comparisons = [c for a in report.arms if a.arm == "worse" for c in a.comparisons if c.metric == "cmmd"]
    assert comparisons and all(c.extractor == label and label in c.words for c in comparisons)
    data = to_json(report)
    assert '"metric":"cmmd"' in data.replace(" ", "")
    markdown = to_markdown(report)
    assert f"CMMD ({label}" in markdown
    if label == STANDIN:
        assert effect.standin and all(c.verdict == "stand-in extractor: descriptive" for c in comparisons)
        assert f"CMMD ({STANDIN}: stand-in extractor: descriptive)" in markdown
    else:
        assert not effect.standin and {c.verdict for c in comparisons} == {"worse"}


def _evaluation(session, grid: Grid, images: int, samples: int | None, seed: int) -> int:  # noqa: ANN001
    """A completed evaluation of every run's step-STEP checkpoint on the controller's own machine (believed for
    any run): its images' metric, and CMMD on `samples` generated samples where given (worse: +0.5, as trained)."""
    rng = np.random.default_rng(seed)
    done = Evaluation(grid_id=grid.id, images=images, step="final", state="completed")
    session.add(done)
    session.flush()
    for run in grid.runs:
        extra: dict = {ASKED: {"samples": samples, "metrics": ["cmmd"]}} if samples else {}
        if samples:
            values = (rng.normal(1.0, 0.3, samples) + (0.5 if run.arm == "worse" else 0.0)).tolist()
            extra |= {"cmmd": float(np.mean(values)), "cmmd_n": samples, "cmmd_se": 0.01, "cmmd_extractor": REAL,
                      "cmmd_samples": values}  # fmt: skip
        session.add(EvaluationResult(evaluation_id=done.id, run_id=run.id, step=STEP, state="completed", node=LOCAL,
                                     val_flow_loss=0.5, extra=extra))  # fmt: skip
    session.flush()
    return done.id


def _cmmd(report) -> object:  # noqa: ANN001
    return next(e for e in report.effects if (e.arm, e.metric, e.against) == ("worse", "cmmd", "control"))


def test_the_distribution_metrics_use_the_evaluation_with_the_most_samples(database_url: str) -> None:
    """An evaluation on more images that measured no distribution metric keeps the training records' CMMD (it
    used to drop it from the report); one that generated 64 samples gives the CMMD effect over n = 64 though
    another has more images, and the report says which evaluation each kind of metric uses."""
    grid_id = _grid(database_url, REAL)
    with session_scope(database_url) as session:
        grid = session.get(Grid, grid_id)
        images = _evaluation(session, grid, images=128, samples=None, seed=1)
        report = build_report(session, grid)
        assert report.evaluation is not None and report.evaluation.id == images
        assert report.distribution_evaluations == [] and _cmmd(report).n == N
        sampled = _evaluation(session, grid, images=16, samples=64, seed=2)
        report = build_report(session, grid)
    assert report.evaluation is not None and report.evaluation.id == images
    assert [(d.id, d.samples) for d in report.distribution_evaluations] == [(sampled, 64)]
    effect = _cmmd(report)
    assert effect.n == 64 and effect.k == 2 and 0.3 < effect.diff < 0.7
    words = to_markdown(report)
    assert f"The effects use evaluation {images}" in words
    assert f"at each run's final checkpoint come from evaluation {sampled} (64 generated" in words
