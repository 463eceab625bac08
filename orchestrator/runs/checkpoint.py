"""One evaluated checkpoint as the detector and the series it reads see it: below both (runs/detector.py
judges a series of them, runs/series_track.py keeps each metric's best one), so neither imports the other
for it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from model.spec import STANDIN
from orchestrator.numbers import is_finite

# `<metric>_extractor`: the label of the network a distribution metric's features came from; a random stand-in's
# label says "stand-in" (the trainer writes it beside the metric, as lpips_backbone beside LPIPS).
EXTRACTOR_SUFFIX = "_extractor"
STANDIN_WORD = "stand-in"


@dataclass(frozen=True)
class Checkpoint:
    """One evaluated checkpoint: its step and every numeric field reported with it.

    A missing field (absent or None) is tolerated; NaN/Inf is kept, because it means diverged.
    `hours` is the arm's elapsed GPU time at this checkpoint in hours (for GPU-hours saved).
    """

    step: int
    values: Mapping[str, float | None] = field(default_factory=dict)
    hours: float | None = None
    lpips_standin: bool = False  # its LPIPS came from the random stand-in backbone
    standin_metrics: frozenset[str] = frozenset()  # distribution metrics whose extractor was a random stand-in

    @classmethod
    def from_mapping(cls, row: Mapping[str, Any]) -> Checkpoint:
        """Build from a fixture dict or a DB Metric row's fields (`step` plus metric columns).

        Non-numeric fields (timestamps, backbone labels) are ignored but for whether LPIPS's backbone and each
        distribution metric's extractor was a random stand-in. Hours come from
        `elapsed_hours`, else `gpu_hours`, else `wall_time_s` / 3600.
        """
        step = row.get("step")
        if isinstance(step, bool) or not isinstance(step, int | float) or step != int(step):
            raise ValueError(f"checkpoint 'step' must be an integer, got {step!r}")
        values: dict[str, float | None] = {}
        for key, val in row.items():
            if key == "step":
                continue
            if val is None:
                values[key] = None
            elif isinstance(val, int | float) and not isinstance(val, bool):
                values[key] = float(val)
        hours = values.get("elapsed_hours")
        if hours is None:
            hours = values.get("gpu_hours")
        if hours is None and values.get("wall_time_s") is not None:
            hours = values["wall_time_s"] / 3600.0  # type: ignore[operator]
        standin = row.get("lpips_backbone") == STANDIN
        standin_metrics = frozenset(
            key.removesuffix(EXTRACTOR_SUFFIX) for key, label in row.items()
            if key.endswith(EXTRACTOR_SUFFIX) and isinstance(label, str) and STANDIN_WORD in label
        )  # fmt: skip
        return cls(step=int(step), values=values, hours=hours, lpips_standin=standin, standin_metrics=standin_metrics)

    def get(self, name: str) -> float | None:
        """The field's value, None when missing (NaN/Inf are returned as they are)."""
        return self.values.get(name)

    def se(self, name: str) -> float | None:
        """The standard error reported with `name` (field `<name>_se`), None when absent or unusable."""
        se = self.values.get(f"{name}_se")
        return se if is_finite(se) and se > 0 else None  # type: ignore[operator]
