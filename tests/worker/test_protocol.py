"""The node protocol (worker/protocol.py): the worker-name rule, the typed checkpoint record, requests the
agent refuses, the refusal rules of a reply's records, and JSON-safe values (non-finite floats as text)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.db.models import METRIC_FIELDS, Metric
from worker.protocol import (
    REQUEST,
    CheckpointRecord,
    Count,
    Number,
    PollResult,
    StartRequest,
    evaluation_worker_name,
    first_error,
    jsonable,
    parse_evaluation_name,
    parse_worker_name,
    refused_records,
    worker_name,
)


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
