"""GPU-hours at equal power (issue 62): what a user would compare a deciding grid with. The fixed designs are
every k seeds x n images, k 3 to 8, n 64 or 256, each read by the report's 95% crossed interval on the same
simulated studies; the one to beat is the cheapest that reaches the deciding grid's power at a true effect
of 2 SE (SE: the fixed 3 x 64 design's, on the profile's components). The deciding grid's GPU-hours are
averaged over true effects of 0, 1 and 2 SE (null, small, large) and divided by that design's:
`hours_vs_best_fixed`. Where no fixed design reaches the grid's power, the largest (8 x 256) stands in,
marked ">", and the ratio is an upper bound (a fixed design at the grid's power would cost more)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

FIXED_SEEDS = range(3, 9)
FIXED_IMAGES = (64, 256)
SE_UNITS = (0.0, 1.0, 2.0)  # the true effects, in SE of the fixed 3 x 64 design


def se_unit(seed_sd: float, image_sd: float, rest_sd: float) -> float:
    """The SE of the fixed 3 seeds x 64 images design's difference, from the difference's components."""
    return math.sqrt(seed_sd**2 / 3 + image_sd**2 / 64 + rest_sd**2 / (3 * 64))


def fixed_designs() -> list[tuple[int, int]]:
    return [(k, n) for k in FIXED_SEEDS for n in FIXED_IMAGES]


def design_hours(k: int, n: int, seed_hours: Mapping[str, float], image_hours: float) -> float:
    """Every arm trained k times and each run evaluated on n images."""
    return sum(k * (h + n * image_hours) for h in seed_hours.values())


@dataclass(frozen=True)
class EqualPower:
    power: float  # the deciding grid's at 2 SE (mean over the comparisons that differ)
    hours: tuple[float, ...]  # its mean GPU-hours a study at 0, 1 and 2 SE
    best: tuple[int, int]  # the cheapest fixed design reaching that power (or 8 x 256)
    best_power: float
    best_hours: float
    reached: bool  # False: no fixed design reached it; `best` is the largest
    below: tuple[float, float] | None = None  # (power, GPU-h) of the strongest cheaper design, short of it

    @property
    def ratio(self) -> float:
        return sum(self.hours) / len(self.hours) / self.best_hours

    @property
    def interpolated(self) -> float:
        """The ratio against a fixed design's GPU-hours at exactly the grid's power, on the line between the
        strongest cheaper design (short of that power) and `best`: the ratio is a step function of the fixed
        designs' powers (a grid just past one design's power is held against the next, up to 17% dearer),
        so this says how much of a ratio is that step. The ratio itself where there is no such pair."""
        if self.below is None or not self.reached or not self.best_power > self.below[0]:
            return self.ratio
        power, hours = self.below
        at = hours + (self.power - power) / (self.best_power - power) * (self.best_hours - hours)
        return sum(self.hours) / len(self.hours) / at

    def words(self) -> str:
        mark = "" if self.reached else ">"
        return f"{mark}{self.best[0]} x {self.best[1]} ({self.best_power:.3f}, {self.best_hours:.1f} GPU-h)"


def equal_power(power: float, hours: Sequence[float], fixed_power: Mapping[tuple[int, int], float],
                seed_hours: Mapping[str, float], image_hours: float) -> EqualPower:  # fmt: skip
    """The comparison at equal power from the grid's power at 2 SE, its GPU-hours at each effect and each fixed
    design's power at 2 SE on the same studies."""
    priced = sorted(fixed_designs(), key=lambda d: design_hours(*d, seed_hours, image_hours))
    reaching = [d for d in priced if fixed_power.get(d, 0.0) >= power]
    best = reaching[0] if reaching else max(priced, key=lambda d: design_hours(*d, seed_hours, image_hours))
    cheaper = priced[: priced.index(best)]
    strongest = max(cheaper, key=lambda d: fixed_power.get(d, 0.0), default=None)
    below = (None if strongest is None
             else (fixed_power.get(strongest, 0.0), design_hours(*strongest, seed_hours, image_hours)))  # fmt: skip
    return EqualPower(power, tuple(hours), best, fixed_power.get(best, 0.0),
                      design_hours(*best, seed_hours, image_hours), bool(reaching), below)  # fmt: skip
