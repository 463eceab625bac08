"""`ablate import` of hostile curves (issue 63): the curves JSON and the tracker exports read into it (W&B
offline runs, TensorBoard event files) with a huge file, a huge number of points or fields, and numbers a
count or an hour cannot be. Each is refused in one line naming the file, the arm, the checkpoint and the
field with the fix (exit code 2, no traceback) before anything is stored. A metric that is NaN or infinite
is how a diverged run records it: kept, and the replayed detector stops the arm as diverged there. Through
the installed `ablate` command on the test's database."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from orchestrator.db.models import Grid
from orchestrator.db.session import session_scope
from orchestrator.results.curves import MAX_CHECKPOINTS, MAX_CURVES_BYTES, MAX_FIELDS, MAX_INT
from orchestrator.runs.ingest import metric_series
from tests.kit.refusals import assert_refused_in_one_line
from tests.orchestrator.results.test_import_hostile_csv import stored

GOOD = {"A_base": {"checkpoints": [{"step": 100, "train_loss": 0.9, "recon_lpips": 0.5},
                                   {"step": 200, "train_loss": 0.8, "recon_lpips": 0.45}]}}  # fmt: skip
AT = "arm 'A_base', checkpoint 1 (step 200)"


@pytest.fixture(scope="module")
def earlier(database_url: str, ablate_cli, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, int, int]:  # type: ignore[no-untyped-def]
    """A grid imported before the hostile files: what is stored, which none of them may change."""
    path = tmp_path_factory.mktemp("good") / "good.json"
    path.write_text(json.dumps(GOOD))
    out = ablate_cli(database_url, "import", str(path), "--name", "earlier")
    assert out.returncode == 0, out.stderr
    return stored(database_url)


def second(field: str, value: str) -> str:
    """GOOD with `field` of its second checkpoint written as the JSON text `value`."""
    return json.dumps(GOOD).replace('"train_loss": 0.8', f'"train_loss": 0.8, "{field}": {value}')


def hostile(tmp_path: Path, kind: str) -> tuple[Path, str]:
    """A hostile curves JSON of `kind` and what its refusal must say."""
    path = tmp_path / f"{kind}.json"
    if kind == "huge":  # a valid document, then whitespace past the size cap (JSON allows it)
        path.write_text(json.dumps(GOOD) + " " * MAX_CURVES_BYTES)
        return path, f"more than the {MAX_CURVES_BYTES} an import reads; keep every Nth step"
    if kind == "points":
        checkpoints = [{"step": s, "train_loss": 0.5} for s in range(MAX_CHECKPOINTS + 1)]
        path.write_text(json.dumps({"A_base": {"checkpoints": checkpoints}}))
        return path, f"arm 'A_base': more than {MAX_CHECKPOINTS} checkpoints over all arms"
    if kind == "fields":
        row = {"step": 100, **{f"m{i}": 0.5 for i in range(MAX_FIELDS + 5)}}
        path.write_text(json.dumps({"A_base": {"checkpoints": [row]}}))
        return path, f"more than {MAX_FIELDS} distinct fields, more than an import reads; keep the metrics"
    text, said = {
        "long field": (second("x" * 100_000, "0.5"), f"{AT}: a field name of 100000 characters ('xxx"),
        "long arm": (json.dumps({"A" * 5000: GOOD["A_base"]}), "a name of 5000 characters, more than 200"),
        "infinite hours": (second("elapsed_hours", "Infinity"), f"{AT}: field 'elapsed_hours' must be a finite "
                           "number from 0 to 1e+06, got 'inf'; leave it out (or null) where the time is unknown"),
        "hours past a date": (second("elapsed_hours", "1e300"), f"{AT}: field 'elapsed_hours' must be a finite"),
        "negative seconds": (second("wall_time_s", "-1"), f"{AT}: field 'wall_time_s' must be a finite number"),
        "nan count": (second("recon_lpips_n", "NaN"), f"{AT}: field 'recon_lpips_n' is a count and must be a whole "
                      f"number from 0 to {MAX_INT}, got 'nan'; leave it out (or null) where it is unknown"),
        "count past an integer": (second("num_recon_samples", "1e300"), f"{AT}: field 'num_recon_samples' is a count"),
        "step past an integer": (json.dumps(GOOD).replace('"step": 200', f'"step": {10**20}'),
                                 f"'step' must be a non-negative integer, got {10**20} (at most {MAX_INT})"),
        "400 digits": (second("val_flow_loss", "1" * 400), f"{AT}: field 'val_flow_loss' is a number of 400 digits"),
        "5000 digits": (second("val_flow_loss", "1" * 5000), "a number of more than 4300 digits, past what an import"),
        "deep": (second("x", "[" * 100_000 + "]" * 100_000), "arrays or objects nested deeper than an import reads"),
    }[kind]
    path.write_text(text)
    return path, said


HOSTILE = ["huge", "points", "fields", "long field", "long arm", "infinite hours", "hours past a date",
           "negative seconds", "nan count", "count past an integer", "step past an integer", "400 digits",
           "5000 digits", "deep"]  # fmt: skip


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_hostile_curves_json_is_refused_in_one_line_and_nothing_stored_changes(
    database_url: str, ablate_cli, earlier: tuple[int, int, int], tmp_path: Path, kind: str  # type: ignore[no-untyped-def]
) -> None:
    path, said = hostile(tmp_path, kind)
    out = ablate_cli(database_url, "import", str(path), "--name", kind)
    assert_refused_in_one_line(out, path, said)
    assert stored(database_url) == earlier


def imported(database_url: str, ablate_cli: Any, path: Path, name: str) -> tuple[str, list[dict[str, Any]]]:  # noqa: ANN401
    """Import `path`: what the command printed and arm A's stored series."""
    out = ablate_cli(database_url, "import", str(path), "--name", name)
    assert out.returncode == 0, out.stderr[-2000:]
    with session_scope(database_url) as s:
        (run,) = s.get_one(Grid, int(out.stdout.split()[1])).runs
        return out.stdout, metric_series(s, run.id)


def test_a_nan_loss_in_curves_json_is_kept_and_the_arm_stopped_as_diverged(
    database_url: str, ablate_cli, tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(GOOD).replace('"train_loss": 0.8', '"train_loss": NaN'))
    stdout, series = imported(database_url, ablate_cli, path, "diverged json")
    assert "A: stopped   diverged @200" in stdout, stdout
    assert math.isnan(series[-1]["train_loss"]) and series[0]["train_loss"] == 0.9


def test_non_finite_values_from_tensorboard(database_url: str, ablate_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A TensorBoard run's NaN loss is its divergence, kept; an infinite `gpu_hours` is refused, naming the
    run's folder, the checkpoint and the field, nothing stored."""
    from torch.utils.tensorboard import SummaryWriter

    def logs(name: str, values: dict[str, float]) -> Path:
        with SummaryWriter(log_dir=str(tmp_path / name / "A_base")) as writer:
            writer.add_scalar("eval/recon_lpips", 0.5, 100)
            writer.add_scalar("train/train_loss", 0.9, 100)
            for tag, value in values.items():
                writer.add_scalar(tag, value, 200)
        return tmp_path / name

    stdout, series = imported(database_url, ablate_cli, logs("nan", {"train/train_loss": math.nan}), "tb nan")
    assert "A: stopped   diverged @200" in stdout and math.isnan(series[-1]["train_loss"]), (stdout, series)
    before = stored(database_url)
    path = logs("inf", {"train/train_loss": 0.8, "gpu_hours": math.inf})
    out = ablate_cli(database_url, "import", str(path), "--name", "tb inf")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert f"{path}: arm 'A_base', checkpoint 1 (step 200): field 'gpu_hours' must be a finite number" in out.stderr
    assert stored(database_url) == before


def test_non_finite_values_from_wandb(database_url: str, ablate_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A W&B run's logged -Infinity loss is its divergence, kept; a count of NaN is refused, naming the file,
    the checkpoint and the field, nothing stored."""
    from tests.orchestrator.trackers.test_exports import history, run_record, wandb_file

    good = history(100, train_loss=0.9, recon_lpips=0.5)
    path = wandb_file(tmp_path / "run-r1.wandb", [run_record("A_base"), good, history(200, train_loss="-Infinity")])
    stdout, series = imported(database_url, ablate_cli, path, "wandb inf")
    assert "A: stopped   diverged @200" in stdout and series[-1]["train_loss"] == -math.inf, (stdout, series)
    before = stored(database_url)
    path = wandb_file(tmp_path / "run-r2.wandb", [run_record("A_base"), good, history(200, recon_lpips_n="NaN")])
    out = ablate_cli(database_url, "import", str(path), "--name", "wandb nan")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert f"{path}: arm 'A_base', checkpoint 1 (step 200): field 'recon_lpips_n' is a count" in out.stderr
    assert stored(database_url) == before


def test_a_wandb_run_past_the_checkpoint_cap_is_refused_with_the_fix(tmp_path: Path) -> None:
    """The caps hold for every form read into curves: a W&B run that logged MAX_CHECKPOINTS + 1 steps."""
    from orchestrator.results.curves import CurvesError
    from orchestrator.trackers.exports import tracker_export_curves
    from tests.orchestrator.trackers.test_exports import history, run_record, wandb_file

    steps = [history(s, train_loss=0.5) for s in range(MAX_CHECKPOINTS + 1)]
    path = wandb_file(tmp_path / "run-r1.wandb", [run_record("A_base"), *steps])
    with pytest.raises(CurvesError) as caught:
        tracker_export_curves(path)
    said = str(caught.value)
    assert said.startswith(f"{path}: arm 'A_base': more than {MAX_CHECKPOINTS} checkpoints"), said
    assert "export its history as a CSV of every Nth step" in said
