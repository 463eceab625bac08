"""The metric the detector judges a stored run on, its best checkpoint, and a stored spec read back: one
answer for the report, the dashboard, `ablate status` and the trackers."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from model.flow_headline import HEADLINE
from model.spec import ArmSpec, DetectorPolicy
from orchestrator.db.models import METRIC_FIELDS, Metric, Run
from orchestrator.numbers import is_finite
from orchestrator.results.reports.stats import LOWER_IS_BETTER, value_of
from orchestrator.runs.detector import resolve_policy


def stored_spec(raw: dict[str, Any] | None) -> ArmSpec | None:
    """A run's stored spec as an ArmSpec; None for a command arm's or one that no longer validates."""
    try:
        return ArmSpec.model_validate(raw or {})
    except ValidationError:
        return None


def judge_metric(run: Run, standin: bool) -> str:
    """The metric the detector judges `run` on: its spec's policy with "auto" made concrete (val_flow_loss
    where LPIPS is the random stand-in, `standin`); a command arm's own metric by its name. A policy that
    no longer validates judges as the default does."""
    return resolve_policy(stored_policy(run), standin).metric


def stored_policy(run: Run) -> DetectorPolicy:
    """The run's detector policy as stored; one that no longer validates reads as the default."""
    try:
        return DetectorPolicy.model_validate((run.spec or {}).get("detector") or {})
    except ValidationError:
        return DetectorPolicy()


def best_checkpoint(run: Run, ms: list[Metric], judge: str) -> Metric | None:
    """The detector's kept checkpoint; without one (a live run), the best `judge` value so far. None where
    neither exists, or `judge` is a command arm's own metric (no column to rank by)."""
    by_step = {m.step: m for m in ms}
    if run.best_step is not None and run.best_step in by_step:
        return by_step[run.best_step]
    if judge not in METRIC_FIELDS and judge != HEADLINE:
        return None
    scored = [(v, m) for m in ms if is_finite(v := value_of(m, judge))]
    sign = 1 if LOWER_IS_BETTER.get(judge, True) else -1
    return min(scored, key=lambda vm: sign * vm[0])[1] if scored else None
