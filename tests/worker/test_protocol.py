"""The node protocol (worker/protocol.py): the worker-name rule, the typed checkpoint record, requests the
agent refuses, the refusal rules of a reply's records, and JSON-safe values (non-finite floats as text)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from model.spec import EvalSpec
from orchestrator.db.models import METRIC_FIELDS, Metric
from worker.protocol import (
    LIST_SHAPES,
    MAX_EVAL_SAMPLES,
    REQUEST,
    CheckpointRecord,
    Count,
    Number,
    PollResult,
    StartRequest,
    first_error,
    jsonable,
    refused_records,
)
from worker.worker_names import evaluation_worker_name, parse_evaluation_name, parse_worker_name, worker_name


def test_a_worker_name_round_trips_and_a_foreign_one_is_none() -> None:
    assert worker_name(12, 3) == "ablate-run-12-3"
    assert parse_worker_name(worker_name(12, 3)) == (12, 3)
    for foreign in ("ablate-run-x-0", "ablate-run-1", "other-run-1-0", "ablate-run-1-0-extra", "../ablate-run-1-0"):
        assert parse_worker_name(foreign) is None, foreign


def test_an_evaluation_workers_name_is_its_own_and_a_run_name_is_not_one() -> None:
    assert evaluation_worker_name(7, 1) == "ablate-eval-7-1" and parse_evaluation_name("ablate-eval-7-1") == (7, 1)
    assert parse_worker_name("ablate-eval-7-1") is None and parse_evaluation_name(worker_name(7, 1)) is None
    assert REQUEST.validate_python({"id": 1, "op": "kill", "name": "ablate-eval-7-1"}).name == "ablate-eval-7-1"
    for foreign in ("ablate-eval-7", "ablate-eval-x-1", "ablate-evaluation-7-1"):
        with pytest.raises(ValidationError):
            REQUEST.validate_python({"id": 1, "op": "kill", "name": foreign})


def test_a_request_for_a_foreign_name_or_an_unknown_op_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError) as foreign:
        REQUEST.validate_python({"id": 1, "op": "kill", "name": "raylet"})
    assert first_error(foreign.value).startswith("kill.name: Value error, not a worker name")
    with pytest.raises(ValidationError) as unknown:
        REQUEST.validate_python({"id": 1, "op": "exec", "name": "ablate-run-1-0"})
    assert "exec" in str(unknown.value)
    with pytest.raises(ValidationError) as spec:  # the arm's spec is checked where the node reads it
        REQUEST.validate_python({"id": 1, "op": "start", "name": "ablate-run-1-0",
                                 "args": {"run_id": 1, "out_dir": "/r", "spec": {"gpus": "many"}}})
    assert first_error(spec.value).startswith("start.args.spec.gpus"), first_error(spec.value)


def test_a_start_request_carries_the_spec_the_agent_validated() -> None:
    request = REQUEST.validate_python(
        {"id": 4, "op": "start", "name": "ablate-run-1-0", "args": {"run_id": 1, "out_dir": "/r", "spec": {}}}
    )
    assert isinstance(request, StartRequest) and request.args.spec.gpu_count() == 1


def test_a_checkpoint_record_refuses_a_wrong_type_naming_the_field_and_keeps_a_command_arm_s_own() -> None:
    record = CheckpointRecord.model_validate({"step": 5, "train_loss": "nan", "lr": 3, "my_metric": [1, 2]})
    assert record.values() == {"step": 5, "train_loss": "nan", "lr": 3.0, "my_metric": [1, 2]}  # as sent
    for field, value in (("train_loss", "0.5"), ("step", "5"), ("recon_lpips_n", 2.5), ("is_best", 1),
                         ("fallbacks", [1]), ("lpips_backbone", "x" * 33)):
        with pytest.raises(ValidationError) as bad:
            CheckpointRecord.model_validate({"step": 5, field: value})
        assert first_error(bad.value).startswith(field), (field, first_error(bad.value))


def test_every_metric_column_is_a_typed_field_of_the_record() -> None:
    """The controller's metric table and the record a node sends name the same numbers, typed alike."""
    fields = CheckpointRecord.model_fields
    for column in METRIC_FIELDS:
        assert column in fields, column
        kind = Metric.__table__.columns[column].type.python_type
        wanted = {float: Number | None, int: Count | None, str: fields["lpips_backbone"].annotation}[kind]
        assert fields[column].annotation == wanted, column


def test_a_records_lists_have_declared_shapes_and_the_text_of_a_non_finite_value() -> None:
    """Finding 5: nothing checked a record's list fields, and a text grid, text timesteps, an integer
    skipped_files or 4097 samples reached the controller's tables and broke the grid's pages."""
    ok = {"step": 5, "val_flow_loss_samples": [0.5, "nan", 1e35], "val_flow_loss_grid": [[0.5, "inf"], [0.4, 0.6]],
          "val_flow_loss_by_t": [0.45, "nan"], "val_flow_loss_t": [0.25, 0.75], "skipped_files": ["a.jpg"],
          "recon_lpips_samples": [], "my_samples": [1, 2.5]}  # fmt: skip
    assert CheckpointRecord.model_validate(ok).values() == {**ok, "my_samples": [1, 2.5]}
    for field, value in (("val_flow_loss_grid", "text"), ("val_flow_loss_grid", [[0.1, 0.2], [0.3]]),
                         ("val_flow_loss_t", "0.25,0.75"), ("val_flow_loss_t", [1.5]), ("skipped_files", 7),
                         ("skipped_files", ["x"] * 65), ("recon_lpips_samples", [0.5] * 4097),
                         ("text_lpips_samples", ["0.5"]), ("val_flow_loss_by_t", [True]),
                         ("val_flow_loss_samples", [10**400]), ("cmmd_per_reference", [0.5] * 4097),
                         ("dino_mmd_per_reference", "many")):  # fmt: skip
        with pytest.raises(ValidationError) as bad:
            CheckpointRecord.model_validate({"step": 5, field: value})
        assert first_error(bad.value).startswith(field), (field, first_error(bad.value))
    with pytest.raises(ValidationError) as own:  # a command arm's `<name>_samples` is a per-sample list too
        CheckpointRecord.model_validate({"step": 5, "loss_samples": "many"})
    assert "loss_samples (a per-sample list)" in first_error(own.value)
    fields = CheckpointRecord.model_fields  # what a reader of stored records checks is what a node may send
    assert all(fields[name].annotation == shape | None for name, shape in LIST_SHAPES.items())
    EvalSpec(num_samples=MAX_EVAL_SAMPLES)  # a spec asks for no more samples than a record may carry
    with pytest.raises(ValidationError):
        EvalSpec(num_samples=MAX_EVAL_SAMPLES + 1)


def test_a_record_may_not_carry_the_controllers_own_bookkeeping() -> None:
    """Finding 6: `nonfinite` is where the controller keeps a record's NaN columns; sent by a node, its
    values ("-1e300") skipped the ranges and reached the series, the detector and the trackers."""
    for value in ({"recon_lpips": "-1e300"}, "x"):
        with pytest.raises(ValidationError) as bad:
            CheckpointRecord.model_validate({"step": 5, "recon_lpips": 0.5, "nonfinite": value})
        assert "nonfinite is the controller's own field" in first_error(bad.value)


def test_refused_records_name_a_step_out_of_order_or_another_run() -> None:
    records = [CheckpointRecord(step=3), CheckpointRecord(step=4, run_id=9)]
    assert refused_records(records, 9, 2) is None
    assert refused_records(records, 9, 3) == "a record with step 3 (expected an integer after 3, at most 2147483647)"
    assert refused_records(records, 8, None) == "a record of step 4 claims run 9, not run 8"
    assert "expected an integer after -1" in refused_records([CheckpointRecord(step=2**40)], 9, None)  # type: ignore[operator]


def test_a_poll_result_names_only_workers() -> None:
    with pytest.raises(ValidationError) as bad:
        PollResult.model_validate({"runs": {"../../etc/passwd": {"state": "lost", "error": "x"}}})
    assert first_error(bad.value).startswith("runs.../../etc/passwd"), first_error(bad.value)


# -- JSON-safe values ------------------------------------------------------------------------------

def test_jsonable_non_finite_paths_nested() -> None:
    value = {
        "loss": float("nan"),
        "grad": float("inf"),
        "neg": float("-inf"),
        "ok": 1.5,
        "n": 3,
        "flag": True,
        "none": None,
        "ckpt": Path("/runs/7/ckpt_0000010.pt"),
        "nested": {"vals": [float("nan"), (Path("a/b"), 2.0)], 5: "int key"},
    }
    out = jsonable(value)
    assert out == {
        "loss": "nan",
        "grad": "inf",
        "neg": "-inf",
        "ok": 1.5,
        "n": 3,
        "flag": True,
        "none": None,
        "ckpt": "/runs/7/ckpt_0000010.pt",
        "nested": {"vals": ["nan", ["a/b", 2.0]], "5": "int key"},
    }
    json.dumps(out, allow_nan=False)
    assert math.isnan(value["loss"])  # the input is left alone


def test_jsonable_scalars_with_item() -> None:
    import torch

    out = jsonable({"loss": torch.tensor(0.25), "bad": torch.tensor(float("nan")), "steps": torch.tensor(4)})
    assert out == {"loss": 0.25, "bad": "nan", "steps": 4}
