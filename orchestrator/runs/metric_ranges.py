"""What each metric can be, whoever reports it: a finite value outside its range is a lie or a bug.

A node's records are claims. The controller refuses a record with a value outside its metric's range
(runs/ingest.py `refused_metrics`), and the detector never compares against one (a control arm's stored
value from before this check). Pure data and one function: no DB, no torch.
"""

from __future__ import annotations

import math

# LPIPS is a distance of unit-normalized features, in [0, 2]; an LPIPS delta in [-2, 2]; losses, norms,
# rates, sizes, times and counts are >= 0. A number no range names (a command arm's own metric) must stay
# within +-ANY_METRIC_BOUND (far past any loss or count; FLOPs fit).
ANY_METRIC_BOUND = 1e30
_LPIPS, _DELTA, _NONNEGATIVE = (0.0, 2.0), (-2.0, 2.0), (0.0, ANY_METRIC_BOUND)
METRIC_RANGES: dict[str, tuple[float, float]] = {
    "recon_lpips": _LPIPS, "recon_lpips_se": _LPIPS, "text_lpips": _LPIPS, "text_lpips_se": _LPIPS,
    "text_manip_delta": _DELTA, "text_manip_delta_se": _LPIPS,
    **dict.fromkeys(
        ("train_loss", "val_flow_loss", "val_flow_loss_se", "grad_norm", "lr", "iter_per_sec", "samples_per_sec",
         "tokens_per_sec", "peak_memory_gb", "wall_time_s", "gpu_hours", "elapsed_hours",
         "recon_lpips_n", "text_lpips_n", "text_manip_delta_n", "val_flow_loss_n"),
        _NONNEGATIVE,
    ),
}  # fmt: skip


def out_of_range(name: str, value: float) -> str | None:
    """Why a finite `value` cannot be metric `name` (NaN/Inf pass: they mean diverged), or None."""
    low, high = METRIC_RANGES.get(name, (-ANY_METRIC_BOUND, ANY_METRIC_BOUND))
    if math.isfinite(value) and not low <= value <= high:
        return f"{name} {value:g} is outside its range [{low:g}, {high:g}]"
    return None
