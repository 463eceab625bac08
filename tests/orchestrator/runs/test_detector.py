"""The collapse detector on constructed metric streams and on the published A-D curves: exact decision sequences."""

from __future__ import annotations

import json
import math
import random

import pytest
from pydantic import ValidationError

from model.spec import DetectorPolicy
from orchestrator.runs.detector import Checkpoint, DecisionKind, decide, projected_hours_saved, replay, replay_arm

C, X, D, S = "continue", "collapse", "diverged", "stalled"


def stream(values: list[float | None], every: int = 100, **extra: list[float | None]) -> list[Checkpoint]:
    """Checkpoints at steps every, 2*every, ...; recon_lpips from `values`, one elapsed hour per checkpoint."""
    out = []
    for i, v in enumerate(values):
        row: dict = {"step": (i + 1) * every, "elapsed_hours": float(i + 1)}
        if v is not None:
            row["recon_lpips"] = v
        for name, vals in extra.items():
            if vals[i] is not None:
                row[name] = vals[i]
        out.append(Checkpoint.from_mapping(row))
    return out


def kinds(series: list[Checkpoint], policy: DetectorPolicy, control: list[Checkpoint] | None = None) -> list[str]:
    """The decision at every prefix, as the controller would see them (not stopping)."""
    total = series[-1].step
    return [decide(series[: i + 1], policy, control, total).kind.value for i in range(len(series))]


POLICY = DetectorPolicy()


def test_monotone_collapse_stops_at_the_second_worse_checkpoint() -> None:
    series = stream([0.95, 0.93, 0.91, 0.90, 0.92, 0.95, 0.99])
    result = replay_arm("arm", series, POLICY)
    assert [d.kind.value for d in result.decisions] == [C, C, C, C, C, X]
    assert result.stopped and result.step_flagged == 600
    assert (result.decision.best_step, result.decision.best_value) == (400, 0.90)
    assert result.gpu_hours_saved == pytest.approx(7.0 - 6.0)
    assert "recon_lpips worsened 2 checkpoints" in result.decision.reason
    assert "0.0500 worse than its best 0.9000 @400" in result.decision.reason


def test_one_bad_checkpoint_then_recovery_continues() -> None:
    series = stream([0.95, 0.93, 0.91, 0.99, 0.90, 0.89])
    assert kinds(series, POLICY) == [C] * 6


def test_small_rise_within_margin_continues() -> None:
    # Like arm C at the end: three worse checkpoints in a row, 0.017 above the best.
    series = stream([0.95, 0.93, 0.9296, 0.9321, 0.9386, 0.9463])
    assert kinds(series, POLICY) == [C] * 6


def test_noisy_healthy_decline_continues() -> None:
    rng = random.Random(0)
    values = [0.98 - 0.004 * i + rng.gauss(0.0, 0.006) for i in range(25)]
    assert any(b > a for a, b in zip(values, values[1:], strict=False))  # really noisy
    assert kinds(stream(values), POLICY) == [C] * 25


def test_nan_metric_is_diverged_at_that_step() -> None:
    series = stream([0.95, 0.93, math.nan, 0.90])
    result = replay_arm("arm", series, POLICY)
    assert [d.kind.value for d in result.decisions] == [C, C, D]
    assert result.step_flagged == 300 and result.stopped
    assert (result.decision.best_step, result.decision.best_value) == (200, 0.93)
    assert "recon_lpips=nan at step 300" in result.decision.reason
    data = json.loads(json.dumps(result.decision.to_dict(), allow_nan=False))  # storable as strict JSON
    assert (data["kind"], data["value"], data["stop"]) == ("diverged", "nan", True)


def test_inf_loss_is_diverged_even_with_a_healthy_metric() -> None:
    series = stream([0.95, 0.93, 0.92], train_loss=[0.1, 0.05, math.inf])
    assert kinds(series, POLICY) == [C, C, D]
    assert "train_loss=inf" in decide(series, POLICY).reason


def test_plateau_far_above_control_is_stalled_after_the_grace_period() -> None:
    control = stream([0.95, 0.94, 0.93, 0.92, 0.91, 0.90, 0.89, 0.88, 0.87, 0.86])
    arm = stream([0.985, 0.983, 0.982, 0.982, 0.982, 0.982, 0.982, 0.982, 0.982, 0.982])
    # grace = 0.4 x 1000 steps: the first verdict is possible at step 400, where the gap is 0.062.
    result = replay_arm("H", arm, POLICY, control)
    assert [d.kind.value for d in result.decisions] == [C, C, C, S]
    assert result.step_flagged == 400
    assert "0.0620 worse than the control's best 0.9200 @400" in result.decision.reason


def test_weaker_arm_within_stall_margin_finishes() -> None:
    control = stream([0.95, 0.94, 0.93, 0.92, 0.91, 0.90])
    arm = stream([0.97, 0.96, 0.955, 0.95, 0.945, 0.94])  # 0.04 behind: weaker, still a result
    assert kinds(arm, POLICY, control) == [C] * 6


def test_stall_uses_only_control_checkpoints_up_to_the_same_step() -> None:
    control = stream([0.95, 0.94, 0.93, 0.92, 0.80, 0.80])  # the control's jump comes at step 500
    arm = stream([0.95, 0.94, 0.93, 0.92, 0.92, 0.92])
    assert kinds(arm, POLICY, control[:4]) == [C] * 6  # control behind: compared with what it has
    assert kinds(arm, POLICY, control) == [C, C, C, C, S, S]


def test_stall_needs_total_steps() -> None:
    control = stream([0.90, 0.90])
    arm = stream([0.99, 0.99])
    d = decide(arm, POLICY, control, total_steps=None)
    assert d.kind is DecisionKind.CONTINUE
    assert "stall check skipped: total_steps unknown" in d.warnings


def test_warn_mode_flags_without_stopping() -> None:
    series = stream([0.95, 0.93, 0.91, 0.90, 0.92, 0.95, 0.99])
    result = replay_arm("arm", series, POLICY.model_copy(update={"mode": "warn"}))
    assert [d.kind.value for d in result.decisions] == [C, C, C, C, C, X, X]
    assert not result.stopped and not any(d.stop for d in result.decisions)
    assert result.step_flagged == 600 and result.gpu_hours_saved == 0.0
    assert result.to_json()["decision"] == X


def test_off_mode_never_flags() -> None:
    series = stream([0.95, 0.90, math.nan])
    assert kinds(series, POLICY.model_copy(update={"mode": "off"})) == [C, C, C]


def test_missing_values_are_skipped() -> None:
    series = stream([0.95, None, 0.93, None, 0.91])
    assert kinds(series, POLICY) == [C] * 5
    d = decide(series[:4], POLICY)
    assert d.value is None and "recon_lpips missing at step 400: nothing to judge" in d.warnings
    # A collapse run counts the values that are there: 0.90 -> 0.92 -> (missing) -> 0.95.
    assert kinds(stream([0.90, 0.92, None, 0.95]), POLICY) == [C, C, C, X]


def test_crossing_the_ceiling_is_collapse_at_once() -> None:
    assert kinds(stream([0.95, 0.90, 1.02]), POLICY) == [C, C, X]
    assert "crossed the ceiling 1" in decide(stream([0.95, 0.90, 1.02]), POLICY).reason
    # Starting above the ceiling (early training) is not a crossing.
    assert kinds(stream([1.05, 1.02, 0.99, 0.97]), POLICY) == [C] * 4


def test_standard_errors_widen_the_margin() -> None:
    values = [0.95, 0.90, 0.92, 0.95]  # 0.05 above the best after two worse checkpoints
    noisy = stream(values, recon_lpips_se=[0.02] * 4)  # 2 x hypot(0.02, 0.02) = 0.057 > 0.05
    precise = stream(values, recon_lpips_se=[0.003] * 4)
    assert kinds(noisy, POLICY) == [C, C, C, C]
    assert kinds(precise, POLICY) == [C, C, C, X]
    assert "recon_lpips_se)" in decide(precise, POLICY).reason
    assert "SE 0.006 assumed" in decide(stream(values), POLICY).reason
    abs_only = POLICY.model_copy(update={"assumed_se": None})
    assert "margin_abs 0.03 only" in decide(stream(values), abs_only).reason


def test_secondary_metrics_warn_but_never_stop() -> None:
    text = [0.93, 0.92, 0.93, 0.95, 0.98]  # collapses by 0.06
    manip = [0.50, 0.52, 0.48, 0.46, 0.44]  # larger is better: falling 0.08 is the bad direction
    series = stream([0.95, 0.94, 0.93, 0.92, 0.91], text_lpips=text, text_manip_delta=manip)
    assert kinds(series, POLICY) == [C] * 5
    warnings = decide(series, POLICY).warnings
    assert len(warnings) == 2
    assert warnings[0].startswith("text_lpips worsened 3 checkpoints") and "warning only" in warnings[0]
    assert warnings[1].startswith("text_manip_delta worsened 3 checkpoints")
    rising_manip = stream([0.95, 0.94, 0.93], text_manip_delta=[0.40, 0.45, 0.50])
    assert decide(rising_manip, POLICY).warnings == ()


def test_higher_is_better_primary() -> None:
    policy = DetectorPolicy(metric="score", metric_mode="max", secondary={}, ceiling=None)
    series = [Checkpoint.from_mapping({"step": s, "score": v}) for s, v in [(1, 0.5), (2, 0.6), (3, 0.55), (4, 0.5)]]
    assert kinds(series, policy) == [C, C, C, X]


def test_checkpoint_from_mapping() -> None:
    cp = Checkpoint.from_mapping({"step": 500, "wall_time_iso": "2026-05-07", "recon_lpips": 0.9, "gpu_hours": 2.5})
    assert cp.step == 500 and cp.get("recon_lpips") == 0.9 and cp.hours == 2.5
    assert "wall_time_iso" not in cp.values
    assert Checkpoint.from_mapping({"step": 1, "wall_time_s": 7200}).hours == 2.0
    with pytest.raises(ValueError, match="'step' must be an integer"):
        Checkpoint.from_mapping({"step": "500"})


def test_policy_validation() -> None:
    with pytest.raises(ValidationError, match="must not repeat the primary metric"):
        DetectorPolicy(secondary={"recon_lpips": "min"})
    with pytest.raises(ValidationError, match="must not repeat the primary metric 'val_flow_loss'"):
        DetectorPolicy(secondary={"val_flow_loss": "min"})  # "auto" may judge it
    with pytest.raises(ValidationError, match="margin_abs"):
        DetectorPolicy(margin_abs=-0.1)
    with pytest.raises(ValidationError, match="marign"):
        DetectorPolicy.model_validate({"marign_abs": 0.1})


def _fixture_curves(published_curves: dict) -> dict[str, list[Checkpoint]]:
    return {arm: [Checkpoint.from_mapping(c) for c in body["checkpoints"]] for arm, body in published_curves.items()}


@pytest.mark.parametrize("control", [None, "A_baseline"])
def test_published_curves_stop_b_only(published_curves: dict, control: str | None) -> None:
    results = {r.arm: r for r in replay(_fixture_curves(published_curves), POLICY, control)}
    b = results["B_tread_adamw"]
    assert b.stopped and b.decision.kind is DecisionKind.COLLAPSE
    assert b.step_flagged is not None and b.step_flagged <= 4000
    assert [d.kind.value for d in b.decisions] == [C] * 7 + [X]  # steps 500..4000
    assert (b.decision.best_step, b.decision.best_value) == (3000, 0.906958)
    assert b.gpu_hours_saved == pytest.approx(94.92 - 74.86)
    for arm in ("A_baseline", "C_tread_muon", "D_full_stack"):
        r = results[arm]
        assert [d.kind.value for d in r.decisions] == [C] * 10, (arm, r.decision.reason)
        assert not r.stopped and r.step_flagged is None and r.gpu_hours_saved == 0.0
    # C's text LPIPS rises 0.038 at the end: a warning, not a stop.
    assert any(w.startswith("text_lpips") for w in results["C_tread_muon"].decision.warnings)


def test_replay_rejects_an_unknown_control(published_curves: dict) -> None:
    with pytest.raises(ValueError, match="control arm 'Z' is not in the curves"):
        replay(_fixture_curves(published_curves), POLICY, "Z")


def test_checkpoint_from_a_db_metric_row() -> None:
    from orchestrator.db.models import METRIC_FIELDS, Metric

    row = Metric(step=1000, recon_lpips=0.93, recon_lpips_se=0.005, gpu_hours=3.0, lpips_backbone="alexnet")
    # As orchestrator.runs.ingest.metric_series hands a stored row to the detector.
    cp = Checkpoint.from_mapping({"step": row.step, **{f: getattr(row, f) for f in METRIC_FIELDS}})
    assert (cp.step, cp.get("recon_lpips"), cp.se("recon_lpips"), cp.hours) == (1000, 0.93, 0.005, 3.0)
    assert cp.get("text_lpips") is None and "lpips_backbone" not in cp.values


def test_projected_hours_saved_is_the_untrained_steps_at_the_arms_own_pace() -> None:
    assert projected_hours_saved(400, 200, 0.01) == pytest.approx(0.01)  # half the steps left
    assert projected_hours_saved(5000, 4000, 80.0) == pytest.approx(20.0)
    assert projected_hours_saved(400, 400, 0.02) == 0.0
    assert projected_hours_saved(None, 200, 0.01) is None and projected_hours_saved(400, 0, 0.0) is None


def _flow_stream(lpips: list[float], loss: list[float], backbone: str) -> list[Checkpoint]:
    """`loss` as both the flow headline (val_flow_ivw) and the plain mean, as a record carries both."""
    return [
        Checkpoint.from_mapping({"step": 100 * (i + 1), "recon_lpips": a, "val_flow_loss": b, "val_flow_loss_se": 0.01,
                                 "val_flow_ivw": b, "val_flow_ivw_se": 0.01, "lpips_backbone": backbone})
        for i, (a, b) in enumerate(zip(lpips, loss, strict=True))
    ]  # fmt: skip


def test_auto_judges_the_flow_loss_where_lpips_is_the_standin() -> None:
    """Stand-in LPIPS drifts down while the flow loss collapses: "auto" stops on the loss (no ceiling:
    1.2 crossed 1.0 without a stop); with real LPIPS the same stream is judged on LPIPS and runs on."""
    lpips = [0.80, 0.79, 0.78, 0.77, 0.76, 0.75]
    loss = [1.50, 0.90, 1.20, 0.60, 0.65, 0.75]
    standin = _flow_stream(lpips, loss, "random_standin")
    assert kinds(standin, POLICY) == [C, C, C, C, C, X]
    verdict = decide(standin, POLICY, total_steps=600)
    assert (verdict.metric, verdict.best_step, verdict.best_value) == ("val_flow_ivw", 400, 0.60)
    # The headline is judged, not the plain mean: a plain mean that keeps falling does not save the arm.
    falling = [Checkpoint(c.step, {**c.values, "val_flow_loss": 1.0 - 0.1 * i}, c.hours, c.lpips_standin)
               for i, c in enumerate(standin)]  # fmt: skip
    assert kinds(falling, POLICY) == [C, C, C, C, C, X]
    assert kinds(_flow_stream(lpips, loss, "alexnet"), POLICY) == [C] * 6
    assert decide(_flow_stream(lpips, loss, "alexnet"), POLICY, total_steps=600).metric == "recon_lpips"
    # a metric named in the spec is used whatever the backbone
    named = DetectorPolicy(metric="recon_lpips")
    assert kinds(standin, named) == [C] * 6


def test_auto_has_no_stall_rule_on_the_flow_loss() -> None:
    """The stall margin is in LPIPS units: on the loss there is none, an arm far behind the control runs on."""
    control = _flow_stream([0.8] * 6, [0.30] * 6, "random_standin")
    behind = _flow_stream([0.8] * 6, [1.0, 0.95, 0.9, 0.85, 0.8, 0.78], "random_standin")
    assert kinds(behind, POLICY, control) == [C] * 6
    assert kinds(behind, DetectorPolicy(metric="val_flow_loss"), control) == [C, C, S, S, S, S]
