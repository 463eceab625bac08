"""The collapse detector: one decision per new checkpoint of an arm, from its metric series alone
(and the control arm's, for stalls).

An ablation must let a slower or weaker arm finish: that is its result. So unlike Ray Tune's and
Optuna's stopping rules, which rank trials against each other and judge best-so-far, this stops
only an arm that breaks: it diverges (NaN/Inf), collapses (improves, then degrades past its own
best by more than noise), or stalls far behind the control arm. Pure functions, no torch, no DB:
the controller feeds every checkpoint to a `Series` and calls `judge` on it (`decide` does both for a
series at once), `ablate replay` calls `replay` on whole curves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from model.spec import DESCRIPTIVE_METRICS, DISTRIBUTION_METRICS, DetectorPolicy
from orchestrator.numbers import is_finite, json_safe
from orchestrator.runs.checkpoint import Checkpoint
from orchestrator.runs.series_track import ControlBests, Direction, Series, worse
from orchestrator.vocabulary import DecisionKind

__all__ = [
    "Checkpoint", "ControlBests", "Decision", "DecisionKind", "ReplayResult", "Series", "decide", "judge", "replay",
    "replay_arm", "resolve_policy",
]  # fmt: skip

AUTO = "auto"
LPIPS_METRIC = "recon_lpips"
FLOW_METRIC = "val_flow_loss"
# Distribution metrics that may judge (fid is descriptive: its 1/n bias depends on the model). The trainer
# measures them every eval.distribution.every-th checkpoint, so most checkpoints carry none of them.
JUDGING_DISTRIBUTION = tuple(m for m in DISTRIBUTION_METRICS if m not in DESCRIPTIVE_METRICS)


@dataclass(frozen=True)
class Decision:
    """The verdict on the newest checkpoint of a series.

    `stop` is True only when the verdict is not `continue` and the policy's mode is `stop`
    (in `warn` mode the arm is flagged and runs on). best_step / best_value: the best checkpoint so far
    by the primary metric (the one judged, in its metric_mode), the one to keep and mark.
    """

    kind: DecisionKind
    step: int
    metric: str
    value: float | None
    best_step: int | None
    best_value: float | None
    reason: str
    warnings: tuple[str, ...] = ()
    stop: bool = False

    @property
    def flagged(self) -> bool:
        return self.kind is not DecisionKind.CONTINUE

    def to_dict(self) -> dict[str, Any]:
        """Strict-JSON-ready (an Event's data, an API response): a NaN/Inf value becomes the string
        "nan"/"inf", because Postgres JSON rejects NaN literals."""
        return {
            "kind": self.kind.value,
            "step": self.step,
            "metric": self.metric,
            "value": json_safe(self.value),
            "best_step": self.best_step,
            "best_value": self.best_value,
            "reason": self.reason,
            "warnings": list(self.warnings),
            "stop": self.stop,
        }


def _margin(now: Checkpoint, best_cp: Checkpoint, name: str, policy: DetectorPolicy) -> tuple[float, str]:
    """The excess over the best that counts as collapse: max(margin_abs, margin_se x SE of the
    difference), and a note on where the SE came from."""
    se_now, se_best = now.se(name), best_cp.se(name)
    if se_now is not None and se_best is not None:
        src = f"{name}_se"
    elif policy.assumed_se is not None:
        src = f"SE {policy.assumed_se:g} assumed where {name}_se is missing"
        se_now = se_now if se_now is not None else policy.assumed_se
        se_best = se_best if se_best is not None else policy.assumed_se
    else:
        return policy.margin_abs, f"margin_abs {policy.margin_abs:g} only: no {name}_se and no assumed_se"
    se_diff = math.hypot(se_now, se_best)
    margin = max(policy.margin_abs, policy.margin_se * se_diff)
    return margin, f"max({policy.margin_abs:g} abs, {policy.margin_se:g} x SE {se_diff:.4f}; {src})"


def _collapse_check(series: Series, name: str, direction: Direction, policy: DetectorPolicy) -> str | None:
    """A description of a monotone collapse of `name` at the newest checkpoint, or None."""
    now, track = series.now, series.track(name, direction)
    value, best = now.get(name), track.best
    if not is_finite(value) or best is None or track.best_cp is None:
        return None
    if track.run < policy.worsening_checkpoints:
        return None
    excess = worse(value, best[1], direction)  # type: ignore[arg-type]
    margin, how = _margin(now, track.best_cp, name, policy)
    if excess <= margin:
        return None
    return (
        f"{name} worsened {track.run} checkpoints in a row to {value:.4f} at step {now.step}, "
        f"{excess:.4f} worse than its best {best[1]:.4f} @{best[0]} (> margin {margin:.4f} = {how})"
    )


def _secondary_warnings(series: Series, policy: DetectorPolicy) -> tuple[str, ...]:
    out = []
    for name, direction in policy.secondary.items():
        msg = _collapse_check(series, name, direction, policy)
        if msg:
            out.append(f"{msg}; secondary metric: warning only")
    return tuple(out)


def resolve_policy(policy: DetectorPolicy, lpips_standin: bool) -> DetectorPolicy:
    """The policy with metric "auto" made concrete: recon_lpips, or val_flow_loss where LPIPS is the
    random stand-in. On the flow loss there is no ceiling (no trivial baseline sits at a fixed value)
    and no stall rule (its margin is not calibrated on any study yet): an arm stops when it diverges or
    collapses past its own best by max(margin_abs, margin_se x SE). A named metric is used as given,
    but for a distribution metric (cmmd, dino_mmd, fd_dinov2): no ceiling and no stall rule (LPIPS's 1.0 and
    0.05 mean nothing on their scales) and no assumed SE (the pass records `<metric>_se`; without it the margin
    is margin_abs alone, in the metric's own units)."""
    if policy.metric in JUDGING_DISTRIBUTION:
        return policy.model_copy(update={"ceiling": None, "stall_margin": math.inf, "assumed_se": None})
    if policy.metric != AUTO:
        return policy
    metric = policy.judged_metric(lpips_standin)
    if metric == LPIPS_METRIC:
        return policy.model_copy(update={"metric": metric})
    return policy.model_copy(update={"metric": metric, "ceiling": None, "stall_margin": math.inf})


def decide(
    series: Sequence[Checkpoint],
    policy: DetectorPolicy,
    control: Sequence[Checkpoint] | None = None,
    total_steps: int | None = None,
) -> Decision:
    """Judge the newest checkpoint of `series` (any order; judged in step order): `judge` on the series
    fed in step order. See `judge` for the rules.

    Args:
        series: the arm's checkpoints so far (at least one).
        policy: the arm's DetectorPolicy.
        control: the control arm's checkpoints so far; None = no stall check.
        total_steps: the arm's planned optimizer steps (for the stall grace period).
    """
    if not series:
        raise ValueError("decide needs at least one checkpoint")
    fed = Series()
    for cp in sorted(series, key=lambda cp: cp.step):
        fed.add(cp)
    return judge(fed, policy, ControlBests(control) if control else None, total_steps)


def judge(
    series: Series, policy: DetectorPolicy, control: ControlBests | None = None, total_steps: int | None = None
) -> Decision:
    """Judge the newest checkpoint of a fed series (the controller feeds each new one and judges it).

    Metric "auto" is resolved on the series (resolve_policy). Guards in order, the first that fires
    decides: policy off; diverged (NaN/Inf in the primary,
    a secondary or a divergence field at this checkpoint); primary missing here (continue, with a
    warning, but none for a distribution metric, which is measured every k-th checkpoint); ceiling crossed;
    monotone collapse over k checkpoints past the margin (over the checkpoints that measured it; a warning
    only where a distribution metric's extractor was a random stand-in); stalled behind
    the control's best up to this step (only past stall_grace_fraction of total_steps; a warning, not a
    stop, where the control's values are `untrusted`). Else continue.
    """
    policy = resolve_policy(policy, series.standin)
    now, name, direction = series.now, policy.metric, policy.metric_mode
    value = now.get(name)
    track = series.track(name, direction)
    best_step, best_value = track.best if track.best else (None, None)
    warnings = list(_secondary_warnings(series, policy))

    def result(kind: DecisionKind, reason: str) -> Decision:
        return Decision(
            kind=kind,
            step=now.step,
            metric=name,
            value=value,
            best_step=best_step,
            best_value=best_value,
            reason=reason,
            warnings=tuple(warnings),
            stop=kind is not DecisionKind.CONTINUE and policy.mode == "stop",
        )

    if policy.mode == "off":
        return result(DecisionKind.CONTINUE, "detector off (policy mode 'off')")

    watched = [name, *policy.secondary, *policy.divergence_fields]
    bad = [f"{f}={now.get(f)}" for f in dict.fromkeys(watched) if now.get(f) is not None and not is_finite(now.get(f))]
    if bad:
        return result(DecisionKind.DIVERGED, f"{', '.join(bad)} at step {now.step}")

    if value is None:
        if name in JUDGING_DISTRIBUTION:  # the pass skipped this checkpoint (eval.distribution.every): expected
            return result(DecisionKind.CONTINUE, f"{name} not measured at step {now.step}: judged where measured")
        warnings.append(f"{name} missing at step {now.step}: nothing to judge")
        return result(DecisionKind.CONTINUE, f"{name} missing at step {now.step}")

    if policy.ceiling is not None:
        earlier = track.before
        # "Crossed": it was better than the ceiling before; an arm that never got below it is a stall case.
        if earlier is not None and worse(earlier[1], policy.ceiling, direction) < 0 <= worse(
            value, policy.ceiling, direction
        ):
            return result(
                DecisionKind.COLLAPSE,
                f"{name} {value:.4f} at step {now.step} crossed the ceiling {policy.ceiling:g} "
                f"(best {best_value:.4f} @{best_step})",
            )

    collapse = _collapse_check(series, name, direction, policy)
    if collapse and name in series.standin_metrics:  # a stand-in metric never carries a verdict
        warnings.append(f"{collapse}; {name} from a random stand-in extractor: a warning only, never a stop")
    elif collapse:
        return result(DecisionKind.COLLAPSE, collapse)

    if control:
        if total_steps is None:
            warnings.append("stall check skipped: total_steps unknown")
        elif now.step >= policy.stall_grace_fraction * total_steps:
            ctrl = control.best(name, direction, now.step)
            if ctrl is None:
                warnings.append(f"stall check skipped: control has no {name} up to step {now.step}")
            elif (gap := worse(best_value, ctrl[1], direction)) > policy.stall_margin:  # type: ignore[arg-type]
                stall = (
                    f"best {name} {best_value:.4f} @{best_step} is {gap:.4f} worse than the control's best "
                    f"{ctrl[1]:.4f} @{ctrl[0]} at step {now.step} (> stall_margin {policy.stall_margin:g})"
                )
                if not control.untrusted:
                    return result(DecisionKind.STALLED, stall)
                warnings.append(f"stall not acted on: {stall}; {control.untrusted}")

    return result(
        DecisionKind.CONTINUE,
        f"{name} {value:.4f} at step {now.step}, best {best_value:.4f} @{best_step} "
        f"({worse(value, best_value, direction):+.4f}; worse {track.run} in a row, k={policy.worsening_checkpoints})",
    )


def projected_hours_saved(total_steps: int | None, stop_step: int | None, hours_at_stop: float | None) -> float | None:
    """Device-hours a live stop saves: the steps it did not train, at the arm's own pace up to the stop
    (hours_at_stop / stop_step per step, evaluation included). None when any input is unknown.

    A replay knows the hours the arm actually spent after the stop (ReplayResult.gpu_hours_saved);
    a live stop can only project them.
    """
    if total_steps is None or stop_step is None or hours_at_stop is None or stop_step <= 0:
        return None
    return hours_at_stop / stop_step * max(total_steps - stop_step, 0)


@dataclass(frozen=True)
class ReplayResult:
    """One arm replayed checkpoint by checkpoint. `decision` is the first flagged decision (the one
    that stopped the arm in stop mode), else the last one; `decisions` is the whole sequence."""

    arm: str
    decision: Decision
    stopped: bool
    step_flagged: int | None
    gpu_hours_saved: float | None  # final elapsed hours - elapsed at the stop; 0 when it ran on
    decisions: tuple[Decision, ...]

    def to_json(self) -> dict[str, Any]:
        """The `ablate replay` line."""
        d = self.decision
        return {
            "arm": self.arm,
            "decision": d.kind.value,
            "step_flagged": self.step_flagged,
            "best_step": d.best_step,
            "best_value": d.best_value,
            "reason": d.reason,
            "gpu_hours_saved": None if self.gpu_hours_saved is None else round(self.gpu_hours_saved, 2),
            "stopped": self.stopped,
            "warnings": list(d.warnings),
        }


def replay_arm(
    arm: str,
    series: Sequence[Checkpoint],
    policy: DetectorPolicy,
    control: Sequence[Checkpoint] | None = None,
) -> ReplayResult:
    """Feed an arm's checkpoints one by one (step order) to `judge`, stopping where it says stop.

    total_steps is the arm's last step; the control series is used as given.
    """
    if not series:
        raise ValueError(f"arm {arm!r} has no checkpoints")
    ordered = sorted(series, key=lambda cp: cp.step)
    decisions: list[Decision] = []
    fed, bests = Series(), ControlBests(control) if control else None
    for cp in ordered:
        fed.add(cp)
        decisions.append(judge(fed, policy, bests, ordered[-1].step))
        if decisions[-1].stop:
            break
    first_flag = next((d for d in decisions if d.flagged), None)
    final = first_flag or decisions[-1]
    stopped = final.stop
    saved: float | None = 0.0
    if stopped:
        at = next(cp for cp in ordered if cp.step == final.step).hours
        end = ordered[-1].hours
        saved = end - at if at is not None and end is not None else None
    return ReplayResult(
        arm=arm,
        decision=final,
        stopped=stopped,
        step_flagged=first_flag.step if first_flag else None,
        gpu_hours_saved=saved,
        decisions=tuple(decisions),
    )


def replay(
    curves: Mapping[str, Sequence[Checkpoint]],
    policy: DetectorPolicy | Mapping[str, DetectorPolicy],
    control: str | None = None,
) -> list[ReplayResult]:
    """Replay every arm (in the mapping's order). With `control`, that arm is replayed first and the
    others are checked for stalls against it, truncated where the detector stopped it.

    policy: one for every arm, or one per arm (each arm's own spec, as `ablate import` replays them).
    """
    if control is not None and control not in curves:
        raise ValueError(f"control arm {control!r} is not in the curves (arms: {', '.join(curves)})")

    def policy_of(arm: str) -> DetectorPolicy:
        return policy if isinstance(policy, DetectorPolicy) else policy[arm]

    results: dict[str, ReplayResult] = {}
    control_series: list[Checkpoint] | None = None
    if control is not None:
        results[control] = replay_arm(control, curves[control], policy_of(control))
        last = results[control].decisions[-1].step
        control_series = [cp for cp in curves[control] if cp.step <= last]
    for arm, series in curves.items():
        if arm not in results:
            results[arm] = replay_arm(arm, series, policy_of(arm), control_series)
    return [results[arm] for arm in curves]
