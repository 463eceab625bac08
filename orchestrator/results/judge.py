"""The metric the detector judges a stored run on, and a stored spec read back: one answer for the report,
the dashboard, `ablate status` and the trackers."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from model.spec import ArmSpec, DetectorPolicy
from orchestrator.db.models import Run
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
    try:
        policy = DetectorPolicy.model_validate((run.spec or {}).get("detector") or {})
    except ValidationError:
        policy = DetectorPolicy()
    return resolve_policy(policy, standin).metric
