"""Replay recorded curves through Ray Tune's and Optuna's stopping rules (the real library classes)
and through our collapse detector, and tabulate who stops which arm, when, and what it saves.

    python bench/compare_stoppers.py [CURVES.json] [--out table.md] [--bad-arm B_tread_adamw]

Two arrival orders: `concurrent` (all arms at once, one GPU each, as the study ran on its quad node:
checkpoints interleaved by elapsed_hours) and `sequential` (one GPU: the arms one after another, in
file order). A stopped arm reports nothing more. The rules see the primary metric (recon_lpips,
lower is better) at every checkpoint, with the step as their time unit. Library defaults are kept
except where their units or sizes do not fit 4 arms x 10 checkpoints; each row says its settings.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from model.spec import DetectorPolicy
from orchestrator.results.curves import load_curves
from orchestrator.runs.detector import Checkpoint, decide

METRIC = "recon_lpips"
DEFAULT_CURVES = Path(__file__).parents[1] / "tests" / "fixtures" / "published_ablation_a_to_d.json"


class Rule(Protocol):
    """One stopping rule driven checkpoint by checkpoint; `report` returns True to stop the arm."""

    def add(self, arm: str) -> None: ...
    def report(self, arm: str, cp: Checkpoint, last: bool) -> bool: ...


# ---- Ray Tune: schedulers are driven through on_trial_add / on_trial_result as TuneController does.


class _Trial:
    """The attributes Ray Tune's schedulers read from a Trial (id, status; hashable by identity)."""

    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id
        self.status = "RUNNING"

    def __repr__(self) -> str:
        return self.trial_id


class _Controller:
    """MedianStoppingRule asks the controller for live trials only to decide whether to PAUSE (yield
    the GPU to a waiting trial); no trial is ever waiting here, so it never pauses."""

    def get_live_trials(self) -> list[_Trial]:
        return []


def _ray_result(cp: Checkpoint, i: int) -> dict[str, float]:
    return {METRIC: cp.get(METRIC), "step": cp.step, "training_iteration": i, "time_total_s": (cp.hours or 0) * 3600}


class RayScheduler:
    def __init__(self, scheduler: object) -> None:
        self.s = scheduler
        self.ctrl = _Controller()
        self.trials: dict[str, _Trial] = {}
        self.count: dict[str, int] = {}

    def add(self, arm: str) -> None:
        self.trials[arm] = _Trial(arm)
        self.count[arm] = 0
        self.s.on_trial_add(self.ctrl, self.trials[arm])  # type: ignore[attr-defined]

    def report(self, arm: str, cp: Checkpoint, last: bool) -> bool:
        from ray.tune.schedulers import TrialScheduler

        self.count[arm] += 1
        result = _ray_result(cp, self.count[arm])
        action = self.s.on_trial_result(self.ctrl, self.trials[arm], result)  # type: ignore[attr-defined]
        if last:
            # ASHA returns STOP at max_t: that is the trial's natural end, not an early stop.
            if action != TrialScheduler.STOP:
                self.s.on_trial_complete(self.ctrl, self.trials[arm], result)  # type: ignore[attr-defined]
            return False
        return action == TrialScheduler.STOP


class RayStopper:
    def __init__(self, stopper: Callable[[str, dict], bool]) -> None:
        self.s = stopper
        self.count: dict[str, int] = {}

    def add(self, arm: str) -> None:
        self.count[arm] = 0

    def report(self, arm: str, cp: Checkpoint, last: bool) -> bool:
        self.count[arm] += 1
        return bool(self.s(arm, _ray_result(cp, self.count[arm]))) and not last


# ---- Optuna: one in-memory study, one ask()ed trial per arm, report + should_prune per checkpoint.


class OptunaPruner:
    def __init__(self, pruner: object) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = optuna.create_study(direction="minimize", pruner=pruner)  # type: ignore[arg-type]
        self.trials: dict[str, optuna.Trial] = {}

    def add(self, arm: str) -> None:
        self.trials[arm] = self.study.ask()

    def report(self, arm: str, cp: Checkpoint, last: bool) -> bool:
        from optuna.trial import TrialState

        trial = self.trials[arm]
        trial.report(cp.get(METRIC), cp.step)  # type: ignore[arg-type]
        if not last and trial.should_prune():
            self.study.tell(trial, state=TrialState.PRUNED)
            return True
        if last:
            self.study.tell(trial, cp.get(METRIC))
        return False


# ---- Ours.


class Detector:
    def __init__(self, policy: DetectorPolicy, control: str | None = None) -> None:
        self.policy, self.control = policy, control
        self.series: dict[str, list[Checkpoint]] = {}
        self.total: dict[str, int] = {}

    def add(self, arm: str) -> None:
        self.series[arm] = []

    def report(self, arm: str, cp: Checkpoint, last: bool) -> bool:
        self.series[arm].append(cp)
        control = self.series.get(self.control) if self.control and arm != self.control else None
        return decide(self.series[arm], self.policy, control, self.total[arm]).stop


@dataclass
class Outcome:
    stops: dict[str, int] = field(default_factory=dict)  # arm -> step at which it was stopped


def arrivals(curves: dict[str, list[Checkpoint]], order: str) -> Iterator[tuple[str, Checkpoint, bool]]:
    """(arm, checkpoint, is_last) in the order the controller would receive them."""
    events = [(arm, cp, i == len(cps) - 1) for arm, cps in curves.items() for i, cp in enumerate(cps)]
    if order == "concurrent":
        rank = {arm: i for i, arm in enumerate(curves)}
        events.sort(key=lambda e: (e[1].hours if e[1].hours is not None else float(e[1].step), e[1].step, rank[e[0]]))
    yield from events


def run(rule: Rule, curves: dict[str, list[Checkpoint]], order: str) -> Outcome:
    if isinstance(rule, Detector):
        rule.total = {arm: cps[-1].step for arm, cps in curves.items()}
    out = Outcome()
    for arm in curves:
        rule.add(arm)
    for arm, cp, last in arrivals(curves, order):
        if arm in out.stops or cp.get(METRIC) is None:
            continue
        if rule.report(arm, cp, last):
            out.stops[arm] = cp.step
    return out


def rules() -> list[tuple[str, Callable[[], Rule]]]:
    """(row label with the settings, factory). Factories build fresh state for each order."""
    import optuna
    from ray.tune.schedulers import AsyncHyperBandScheduler, MedianStoppingRule
    from ray.tune.stopper import TrialPlateauStopper

    return [
        (
            "Ray Tune MedianStoppingRule (time_attr=step, grace_period=500, min_samples_required=3)",
            lambda: RayScheduler(
                MedianStoppingRule(
                    time_attr="step", metric=METRIC, mode="min", grace_period=500, min_samples_required=3
                )
            ),
        ),
        (
            "Ray Tune AsyncHyperBandScheduler / ASHA (time_attr=step, max_t=5000, grace_period=500, "
            "reduction_factor=4)",
            lambda: RayScheduler(
                AsyncHyperBandScheduler(
                    time_attr="step", metric=METRIC, mode="min", max_t=5000, grace_period=500, reduction_factor=4
                )
            ),
        ),
        (
            "Ray Tune TrialPlateauStopper (std=0.01, num_results=4, grace_period=4; defaults)",
            lambda: RayStopper(TrialPlateauStopper(metric=METRIC, std=0.01, num_results=4, grace_period=4)),
        ),
        (
            "Optuna MedianPruner (n_startup_trials=1, n_warmup_steps=0)",
            lambda: OptunaPruner(optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0)),
        ),
        (
            "Optuna PatientPruner (wrapped_pruner=None, patience=2, min_delta=0)",
            lambda: OptunaPruner(optuna.pruners.PatientPruner(None, patience=2, min_delta=0.0)),
        ),
        (
            "Optuna PatientPruner (wrapped_pruner=None, patience=1, min_delta=0)",
            lambda: OptunaPruner(optuna.pruners.PatientPruner(None, patience=1, min_delta=0.0)),
        ),
        (
            "Optuna ThresholdPruner (upper=1.0: LPIPS of a trivial baseline)",
            lambda: OptunaPruner(optuna.pruners.ThresholdPruner(upper=1.0)),
        ),
        ("ablate collapse detector (default DetectorPolicy)", lambda: Detector(DetectorPolicy())),
        (
            "ablate collapse detector (default DetectorPolicy, --control A_baseline)",
            lambda: Detector(DetectorPolicy(), control="A_baseline"),
        ),
    ]


def saved_hours(cps: list[Checkpoint], step: int) -> float:
    at = next(cp for cp in cps if cp.step == step).hours
    return (cps[-1].hours or 0.0) - (at or 0.0)


def table(curves: dict[str, list[Checkpoint]], bad_arm: str) -> str:
    best_step, best_val = min(((cp.step, cp.get(METRIC)) for cp in curves[bad_arm]), key=lambda sv: sv[1])
    head = (
        f"| rule (settings) | order | stops (arm @ step) | false stops | {bad_arm} stopped at | "
        f"keeps {bad_arm}'s best ({best_val:.3f} @{best_step}) | GPU-h saved on {bad_arm} | "
        f"GPU-h saved in all |\n|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for label, factory in rules():
        # Without a control our detector sees each arm alone: the arrival order cannot matter.
        alone = label.startswith("ablate") and "control" not in label
        for order in ("any",) if alone else ("concurrent", "sequential"):
            out = run(factory(), curves, "concurrent" if alone else order)
            stops = ", ".join(f"{arm} @{step}" for arm, step in out.stops.items()) or "none"
            false = [arm for arm in out.stops if arm != bad_arm]
            false_txt = f"{len(false)} ({', '.join(false)})" if false else "0"
            bad_at = out.stops.get(bad_arm)
            keeps = "n/a (runs to the end)" if bad_at is None else ("yes" if bad_at > best_step else "**no**")
            bad_saved = saved_hours(curves[bad_arm], bad_at) if bad_at is not None else 0.0
            all_saved = sum(saved_hours(curves[a], s) for a, s in out.stops.items())
            rows.append(
                f"| {label} | {order} | {stops} | {false_txt} | {bad_at if bad_at is not None else 'not stopped'} "
                f"| {keeps} | {bad_saved:.1f} | {all_saved:.1f} |"
            )
    return head + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("curves", nargs="?", default=str(DEFAULT_CURVES), help="curves JSON (default: the published A-D)")
    ap.add_argument("--bad-arm", default="B_tread_adamw", help="the arm that collapses (any other stop is false)")
    ap.add_argument("--out", help="also write the markdown table to this file")
    args = ap.parse_args(argv)
    logging.getLogger("ray").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*is experimental")  # optuna's PatientPruner
    np.random.seed(0)  # ASHA picks a bracket at random; with one bracket the pick is fixed anyway
    loaded = load_curves(args.curves)
    curves = {arm: list(c.checkpoints) for arm, c in loaded.items()}
    if args.bad_arm not in curves:
        print(f"error: --bad-arm {args.bad_arm!r} is not in {args.curves} (arms: {', '.join(curves)})", file=sys.stderr)
        return 2
    md = table(curves, args.bad_arm)
    print(md, end="")
    if args.out:
        Path(args.out).write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
