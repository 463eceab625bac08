"""Group-sequential boundaries by alpha spending: the Lan-DeMets spending functions (O'Brien-Fleming and
Pocock type), two-sided symmetric boundaries for any increasing information fractions by the recursive
numerical integration of Armitage, McPherson and Rowe (1969) (Jennison & Turnbull 2000, chapter 19), the
probability of stopping at each look for given boundaries, and the conditional power at the budget.
Pure: numpy and scipy. sequential.py decides with them.

Alpha is spent alpha/2 on each side, as R's ldbounds and gsDesign (test.type 2) do: O'Brien-Fleming type,
each side 2 - 2 Phi(z_{1-alpha/4}/sqrt t); Pocock type, alpha ln(1 + (e-1) t) over both sides.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import Literal

import numpy as np

Spending = Literal["obf", "pocock"]

_GRID_STEP = 0.05  # integration mesh on the z scale (Simpson); published boundaries agree to 1e-4 (tests)
_Z_CAP = 12.0  # where a look spends nothing, the continuation region is cut at |z| < this (mass < 1e-30 beyond)
_NORMAL = NormalDist()


def upper_tail(x: float) -> float:
    """P(Z >= x) for a standard normal Z, accurate far out (1 - cdf would round to 0)."""
    return _NORMAL.cdf(-x)


def upper_quantile(p: float) -> float:
    """x with P(Z >= x) = p."""
    return -_NORMAL.inv_cdf(p)


def _cdf(x: np.ndarray) -> np.ndarray:
    from scipy.special import ndtr  # lazily: the API imports the decision maths and must start fast

    return ndtr(x)


def _pdf(x: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def spent(fraction: float, alpha: float = 0.05, spending: Spending = "obf") -> float:
    """The cumulative two-sided alpha spent at information fraction `fraction` (0 at 0, alpha at 1)."""
    t = min(max(fraction, 0.0), 1.0)
    if t <= 0:
        return 0.0
    if spending == "obf":  # each side alpha/2 spent by 2 - 2 Phi(z_{1-(alpha/2)/2} / sqrt t)
        return float(min(alpha, 2 * 2 * upper_tail(upper_quantile(alpha / 4) / math.sqrt(t))))
    if spending == "pocock":
        return alpha * math.log(1 + (math.e - 1) * t)
    raise ValueError(f"spending must be 'obf' or 'pocock', got {spending!r}")


def _mesh(c: float) -> tuple[np.ndarray, np.ndarray]:
    """Simpson points and weights over (-c, c)."""
    half = min(c, _Z_CAP)
    m = max(3, 2 * math.ceil(half / _GRID_STEP) + 1)
    z = np.linspace(-half, half, m)
    w = np.ones(m)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return z, w * (z[1] - z[0]) / 3


@dataclass
class _Continuation:
    """The sub-density of Z at the last look over the region where no boundary was crossed, on a mesh."""

    t: float  # that look's information fraction
    z: np.ndarray
    mass: np.ndarray  # density x Simpson weight at each point

    def crossing(self, c: float, t: float, drift: float) -> float:
        """P(not stopped so far and |Z| >= c at the next look, fraction t); drift per unit of fraction on
        the B = Z sqrt(t) scale (0 under the null)."""
        dt = t - self.t
        centre = self.z * math.sqrt(self.t) + drift * dt  # B at t, given z
        sd = math.sqrt(dt)
        up = _cdf((centre - c * math.sqrt(t)) / sd)
        down = _cdf((-c * math.sqrt(t) - centre) / sd)
        return float(np.dot(self.mass, up + down))

    def step(self, c: float, t: float, drift: float) -> _Continuation:
        z, w = _mesh(c)
        dt = t - self.t
        centre = self.z * math.sqrt(self.t) + drift * dt
        kernel = _pdf((z[:, None] * math.sqrt(t) - centre[None, :]) / math.sqrt(dt)) * math.sqrt(t / dt)
        return _Continuation(t, z, w * (kernel @ self.mass))


def _start(c: float, t: float, drift: float) -> _Continuation:
    z, w = _mesh(c)
    return _Continuation(t, z, w * _pdf(z - drift * math.sqrt(t)))


def _checked(fractions: Sequence[float]) -> tuple[float, ...]:
    ts = tuple(float(t) for t in fractions)
    if not ts or any(not 0 < t <= 1 for t in ts) or any(b <= a for a, b in zip(ts, ts[1:], strict=False)):
        raise ValueError(f"information fractions must increase within (0, 1], got {list(ts)}")
    return ts


@lru_cache(maxsize=4096)
def _boundaries(ts: tuple[float, ...], alpha: float, spending: Spending) -> tuple[float, ...]:
    bounds: list[float] = []
    state: _Continuation | None = None
    previous = 0.0
    for t in ts:
        cumulative = spent(t, alpha, spending)
        spend = cumulative - previous
        if state is None:
            c = upper_quantile(spend / 2) if spend > 0 else math.inf
            state = _start(c, t, 0.0)
        else:
            left = float(state.mass.sum())  # P(no boundary crossed so far)
            if spend <= 0:
                c = math.inf
            elif spend >= left:
                c = 0.0
            else:
                from scipy.optimize import brentq  # lazily, as _cdf

                c = brentq(lambda x, s=state, tt=t, sp=spend: s.crossing(x, tt, 0.0) - sp, 0.0, 40.0, xtol=1e-9)
            state = state.step(c, t, 0.0)
        bounds.append(c)
        previous = max(previous, cumulative)
    return tuple(bounds)


def boundaries(fractions: Sequence[float], alpha: float = 0.05, spending: Spending = "obf") -> tuple[float, ...]:
    """Two-sided normal boundaries c_1..c_K (reject when |Z_j| >= c_j) for looks at increasing information
    `fractions` in (0, 1], spending alpha by `spending`; inf where a look spends nothing."""
    return _boundaries(_checked(fractions), float(alpha), spending)


def exit_probabilities(bounds: Sequence[float], fractions: Sequence[float], drift: float = 0.0) -> list[float]:
    """P(the first crossing of |Z| >= c_j is at look j), for each look: the alpha each look spends under the
    null (drift 0), or the power it adds under a drift theta (E[Z_j] = theta sqrt(t_j))."""
    ts = _checked(fractions)
    out: list[float] = []
    state: _Continuation | None = None
    for c, t in zip(bounds, ts, strict=True):
        if state is None:
            m = drift * math.sqrt(t)
            out.append(upper_tail(c - m) + upper_tail(c + m))
            state = _start(c, t, drift)
        else:
            out.append(state.crossing(c, t, drift))
            state = state.step(c, t, drift)
    return out


def conditional_power(z: float, fractions: Sequence[float], alpha: float = 0.05, spending: Spending = "obf") -> float:
    """P(crossing at the budget, fraction 1, with one more look there) given Z = z now, under the current
    trend (the drift the estimate shows so far), on the normal scale."""
    ts = _checked(fractions)
    t = ts[-1]
    if t >= 1:
        return 0.0
    c = boundaries(ts + (1.0,), alpha, spending)[-1]
    mean, sd = abs(z) / math.sqrt(t), math.sqrt(1 - t)  # B(1) given B(t) = z sqrt(t) and drift z/sqrt(t)
    return upper_tail((c - mean) / sd) + upper_tail((c + mean) / sd)
