"""What each metric can be, whoever reports it: a finite value outside its range is a lie or a bug.

A node's records are claims. The controller refuses a record with a value outside its metric's range
(runs/ingest.py `refused_metrics`), and the detector never compares against one (a control arm's stored
value from before this check). Pure data and one function: no DB, no torch.
"""

from __future__ import annotations

import math

from model.spec import DISTRIBUTION_METRICS

# LPIPS is a distance of unit-normalized features, in [0, 2]; an LPIPS delta in [-2, 2]; losses, norms,
# rates, sizes, times and counts are >= 0 with no upper end (a diverging loss or lr can take any size);
# a number no range names (a command arm's own metric) has no range.
_LPIPS, _DELTA, _NONNEGATIVE = (0.0, 2.0), (-2.0, 2.0), (0.0, math.inf)
# Past this magnitude a float is overflow, not a measurement: it is stored as +-inf, which the detector
# reads as `diverged` for the run that sent it (so a control's 1e300 stops only the control, as inf does).
ANY_METRIC_BOUND = 1e30
# A distribution metric's MMD² (cmmd, dino_mmd) is 1000 x kernel means in [0, 1] (model/distribution_stats.py),
# and so is each per-sample pseudo-value c_i = U_xx + 2 (n-1)/(n-2) (g_i - U_xx) - 2 r_i + U_yy: |c_i| <=
# 1 + 2 (n-1)/(n-2) <= 5 (x 1000) at the n >= 3 samples it needs; the U-statistic can be slightly negative.
# A Fréchet distance has no bound but its round-off below 0, so it is left unranged; its SE, n and the pass's
# seconds are >= 0.
_MMD = (-5000.0, 5000.0)
METRIC_RANGES: dict[str, tuple[float, float]] = {
    "cmmd": _MMD, "dino_mmd": _MMD,
    **{f"{m}_{part}": _NONNEGATIVE for m in DISTRIBUTION_METRICS for part in ("se", "n")},
    "distribution_seconds": _NONNEGATIVE,
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
    low, high = METRIC_RANGES.get(name, (-math.inf, math.inf))
    if math.isfinite(value) and not low <= value <= high:
        return f"{name} {value:g} is outside its range [{low:g}, {high:g}]"
    return None


def overflowed(value: float) -> float:
    """`value`, or +-inf where it is past +-ANY_METRIC_BOUND (overflow: the run diverged)."""
    return math.copysign(math.inf, value) if math.isfinite(value) and abs(value) > ANY_METRIC_BOUND else value


def comparable(name: str, value: float) -> bool:
    """Whether a stored value may stand as a control's best: within its range and not overflow (a value
    stored before these checks, say)."""
    return out_of_range(name, value) is None and not (math.isfinite(value) and abs(value) > ANY_METRIC_BOUND)
