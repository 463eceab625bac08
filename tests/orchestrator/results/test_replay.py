"""The curves reader and `ablate replay` (run as the installed console script)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.results.curves import CurvesError, load_curves, parse_curves

FIXTURE = Path(__file__).parents[2] / "fixtures" / "published_ablation_a_to_d.json"
ABLATE = str(Path(sys.executable).with_name("ablate"))
KEYS = {"arm", "decision", "step_flagged", "best_step", "best_value", "reason", "gpu_hours_saved"}


def ablate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ABLATE, *args], capture_output=True, text=True, timeout=120)


def test_reads_the_fixture_in_step_order() -> None:
    curves = load_curves(FIXTURE)
    assert list(curves) == ["A_baseline", "B_tread_adamw", "C_tread_muon", "D_full_stack"]
    b = curves["B_tread_adamw"]
    assert [cp.step for cp in b.checkpoints] == list(range(500, 5001, 500))
    assert b.checkpoints[5].get("recon_lpips") == 0.906958 and b.checkpoints[5].hours == 55.02
    assert b.raw[5]["wall_time_iso"] == "2026-05-09T23:30:02"  # extra keys kept for `ablate import`


def test_subset_of_metrics_extra_keys_and_unsorted_steps() -> None:
    curves = parse_curves(
        {"x": {"checkpoints": [{"step": 20, "recon_lpips": 0.9, "note": "ok"}, {"step": 10, "anything": [1]}]}}
    )
    assert curves["x"].label == "x"
    assert [cp.step for cp in curves["x"].checkpoints] == [10, 20]
    assert curves["x"].checkpoints[0].get("recon_lpips") is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "expected a JSON object"),
        ({"a": 3}, "arm 'a': expected an object with 'checkpoints', got int"),
        ({"a": {"checkpoints": []}}, "arm 'a': 'checkpoints' must be a non-empty list"),
        ({"a": {"label": 5, "checkpoints": [{"step": 1}]}}, "arm 'a': 'label' must be a string"),
        ({"a": {"checkpoints": [{"recon_lpips": 0.9}]}}, "arm 'a', checkpoint 0: 'step' must be"),
        ({"a": {"checkpoints": [{"step": 1.5}]}}, "'step' must be a non-negative integer, got 1.5"),
        (
            {"a": {"checkpoints": [{"step": 1}, {"step": 2, "recon_lpips": "0.9"}]}},
            "arm 'a', checkpoint 1 (step 2): field 'recon_lpips' must be a number or null, got '0.9'",
        ),
        ({"a": {"checkpoints": [{"step": 1}, {"step": 1}]}}, "arm 'a', checkpoint 1 (step 1): duplicate step"),
    ],
)
def test_malformed_curves_name_the_place(data: object, message: str) -> None:
    with pytest.raises(CurvesError) as err:
        parse_curves(data, source="c.json")
    assert str(err.value).startswith("c.json")
    assert message in str(err.value)


def test_cli_replays_the_published_curves() -> None:
    proc = ablate("replay", str(FIXTURE))
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["arm"] for r in lines] == ["A_baseline", "B_tread_adamw", "C_tread_muon", "D_full_stack"]
    assert all(KEYS <= set(r) for r in lines)
    by_arm = {r["arm"]: r for r in lines}
    b = by_arm["B_tread_adamw"]
    assert b["decision"] == "collapse" and b["step_flagged"] <= 4000
    assert (b["best_step"], b["best_value"]) == (3000, 0.906958)
    assert b["gpu_hours_saved"] == pytest.approx(20.06)
    assert "recon_lpips" in b["reason"]
    for arm in ("A_baseline", "C_tread_muon", "D_full_stack"):
        assert by_arm[arm]["decision"] == "continue" and by_arm[arm]["step_flagged"] is None


def test_cli_control_and_warn_policy(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("detector:\n  mode: warn\n")
    proc = ablate("replay", str(FIXTURE), "--policy", str(policy), "--control", "A_baseline")
    assert proc.returncode == 0, proc.stderr
    b = next(json.loads(line) for line in proc.stdout.splitlines() if "B_tread_adamw" in line)
    assert b["decision"] == "collapse" and b["step_flagged"] == 4000
    assert b["stopped"] is False and b["gpu_hours_saved"] == 0.0


def test_cli_diverged_curve(tmp_path: Path) -> None:
    curves = tmp_path / "nan.json"
    curves.write_text('{"x": {"checkpoints": [{"step": 1, "recon_lpips": 0.9, "elapsed_hours": 1},'
                      ' {"step": 2, "recon_lpips": NaN, "elapsed_hours": 2}, {"step": 3, "elapsed_hours": 5}]}}')
    proc = ablate("replay", str(curves))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["decision"], out["step_flagged"], out["gpu_hours_saved"]) == ("diverged", 2, 3.0)


@pytest.mark.parametrize(
    ("content", "extra_args", "message"),
    [
        ('{"x": {"checkpoints": [{"step": 1, "recon_lpips": "bad"}]}}', [],
         "arm 'x', checkpoint 0 (step 1): field 'recon_lpips' must be a number or null"),
        ("{not json", [], "not valid JSON"),
        (None, ["--control", "Z"], "--control 'Z' is not an arm"),
    ],
)
def test_cli_bad_input_is_one_line(tmp_path: Path, content: str | None, extra_args: list[str], message: str) -> None:
    path = FIXTURE
    if content is not None:
        path = tmp_path / "bad.json"
        path.write_text(content)
    proc = ablate("replay", str(path), *extra_args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert message in proc.stderr


def test_cli_bad_policy_and_missing_file(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text("margin_abs: -1\nworsening: 2\n")
    proc = ablate("replay", str(FIXTURE), "--policy", str(policy))
    assert proc.returncode == 2 and "margin_abs" in proc.stderr and "worsening" in proc.stderr
    proc = ablate("replay", str(tmp_path / "missing.json"))
    assert proc.returncode == 2 and "not found" in proc.stderr and "Traceback" not in proc.stderr
