"""ArmWorker without Ray: records survive a new worker (records.jsonl + the trainer's metrics.jsonl),
poll hands every record on exactly once with done/error, request_stop reaches the stream, and
records are JSON-safe. The controller wraps ArmWorker with ray.remote; here it is a plain object whose
`train_fn` points at small generators in a helper module written to tmp_path."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from model.spec import ArmSpec
from worker.actor import ArmWorker, load_records
from worker.checkpoint import checkpoint_path, periodic_checkpoints
from worker.run_files import METRICS_NAME, RECORDS_NAME

HELPER = "actor_test_streams"

# Stand-in train_arm functions (same signature). Module-level state lets a test gate and observe them.
HELPER_SOURCE = textwrap.dedent(
    '''
    import threading
    import time

    gate = threading.Event()
    calls = []
    stop_seen = []


    def _note(spec, out_dir, device, lpips_weights):
        calls.append({"spec": spec, "out_dir": out_dir, "device": device, "lpips_weights": lpips_weights})


    def many(spec, out_dir, device="cpu", should_stop=None, lpips_weights=None):
        """200 records as fast as they come, then return: races the poller against done."""
        _note(spec, out_dir, device, lpips_weights)
        for step in range(1, 201):
            yield {"step": step, "loss": 1.0 / step}


    def gated(spec, out_dir, device="cpu", should_stop=None, lpips_weights=None):
        """Step 1, then wait for the test's gate, then steps 2 and 3 and return at once."""
        _note(spec, out_dir, device, lpips_weights)
        yield {"step": 1}
        if not gate.wait(10):
            raise RuntimeError("gate never opened")
        yield {"step": 2}
        yield {"step": 3}


    def resumed(spec, out_dir, device="cpu", should_stop=None, lpips_weights=None):
        """What a resumed train_arm does: continue after the records already on disk."""
        _note(spec, out_dir, device, lpips_weights)
        yield {"step": 40, "loss": 0.4}


    def raises(spec, out_dir, device="cpu", should_stop=None, lpips_weights=None):
        _note(spec, out_dir, device, lpips_weights)
        yield {"step": 1, "loss": 1.0}
        raise RuntimeError("loss went nan at step 2")


    def mistyped(spec, out_dir, device="cpu", should_stop=None, lpips_weights=None):
        """A trainer whose second record breaks the protocol: a loss as words."""
        _note(spec, out_dir, device, lpips_weights)
        yield {"step": 1, "train_loss": 0.5}
        yield {"step": 2, "train_loss": "low"}
        yield {"step": 3, "train_loss": 0.25}


    def until_stopped(spec, out_dir, device="cpu", should_stop=None, lpips_weights=None):
        """Like train_arm: run until should_stop(), then yield a final record and return."""
        _note(spec, out_dir, device, lpips_weights)
        step = 0
        deadline = time.monotonic() + 10
        while not should_stop():
            if time.monotonic() > deadline:
                raise RuntimeError("should_stop never turned true")
            step += 1
            yield {"step": step, "final": False}
            time.sleep(0.005)
        stop_seen.append(step)
        yield {"step": step + 1, "final": True}
    '''
)


@pytest.fixture
def streams(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The helper module, importable by name (as ArmWorker's importlib lookup needs), fresh per test."""
    helper_dir = tmp_path / "helper"
    helper_dir.mkdir()
    (helper_dir / f"{HELPER}.py").write_text(HELPER_SOURCE)
    monkeypatch.syspath_prepend(str(helper_dir))
    sys.modules.pop(HELPER, None)
    module = importlib.import_module(HELPER)
    yield module
    module.gate.set()  # never leave a training thread blocked
    sys.modules.pop(HELPER, None)


def make_worker(out_dir: Path, fn: str, **kw: Any) -> ArmWorker:
    return ArmWorker(
        run_id=7, spec=ArmSpec().model_dump(mode="json"), out_dir=str(out_dir), train_fn=f"{HELPER}:{fn}", **kw
    )


def poll_until_done(worker: ArmWorker, after_step: int | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Poll the way the launcher does: advance after_step to the newest step seen, stop at done/error."""
    got: list[dict[str, Any]] = []
    for _ in range(2000):
        reply = worker.poll(after_step, wait_s=1.0)
        got.extend(reply["records"])
        if reply["records"]:
            after_step = max(int(r["step"]) for r in reply["records"])
        if reply["state"] != "running":
            return got, reply
    raise AssertionError("worker never finished")


def write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(lines))


# -- load_records ---------------------------------------------------------------------------------


def test_load_records_empty_dir(tmp_path: Path) -> None:
    assert load_records(tmp_path) == []


def test_load_records_merges_metrics_up_to_newest_checkpoint(tmp_path: Path) -> None:
    # Checkpoints at 20 and 30 on disk (10 was pruned: its metrics line still counts, it is <= newest).
    for step in (20, 30):
        checkpoint_path(tmp_path, step).touch()
    (tmp_path / "ckpt_notastep.pt").touch()  # not a periodic checkpoint name: ignored
    assert [s for s, _ in periodic_checkpoints(tmp_path)] == [20, 30]

    # Ours: steps 10 and 20 (20 differs from the trainer's line: ours wins), plus a kill -9 stub.
    write_lines(
        tmp_path / RECORDS_NAME,
        [
            json.dumps({"step": 20, "loss": 0.2, "src": "ours"}) + "\n",
            json.dumps({"step": 10, "loss": 0.1, "src": "ours"}) + "\n",
            '{"step": 25, "lo',  # cut short by a kill -9
        ],
    )
    # The trainer's: 10, 20, 30 (checkpointed), 40 (line written, checkpoint never landed), a stub.
    write_lines(
        tmp_path / METRICS_NAME,
        [
            json.dumps({"step": 10, "loss": 9.0, "src": "trainer"}) + "\n",
            json.dumps({"step": 20, "loss": 9.0, "src": "trainer"}) + "\n",
            # json.dumps writes bare NaN/Infinity; load_records must make them JSON-column safe.
            json.dumps({"step": 30, "loss": float("nan"), "grad": float("inf"), "src": "trainer"}) + "\n",
            json.dumps({"step": 40, "loss": 0.04, "src": "trainer"}) + "\n",
            '{"step": 50, "loss": 0.0',
        ],
    )

    records = load_records(tmp_path)

    assert [r["step"] for r in records] == [10, 20, 30]
    assert [r["src"] for r in records] == ["ours", "ours", "trainer"]
    assert records[2]["loss"] == "nan" and records[2]["grad"] == "inf"
    json.dumps(records, allow_nan=False)  # strict JSON, as Postgres JSON columns need


def test_load_records_without_checkpoints_ignores_metrics(tmp_path: Path) -> None:
    write_lines(tmp_path / METRICS_NAME, [json.dumps({"step": 10, "loss": 0.1}) + "\n"])
    write_lines(tmp_path / RECORDS_NAME, [json.dumps({"step": 5, "loss": 0.5}) + "\n"])
    assert load_records(tmp_path) == [{"step": 5, "loss": 0.5}]


# -- poll: records, done, error ----------------------------------------------------------------------


def test_poll_hands_every_record_once_and_done_with_the_last(tmp_path: Path, streams: ModuleType) -> None:
    worker = make_worker(tmp_path / "run", "many", lpips_weights=str(tmp_path / "alex.pth"))
    got, final = poll_until_done(worker)

    # Stopping at the first "done" reply (as the launcher does) must not lose the tail.
    assert [r["step"] for r in got] == list(range(1, 201))
    assert final["state"] == "done" and final["error"] is None and final["stopping"] is False
    assert final["info"]["pid"] > 0
    # Durable: every record is in records.jsonl, so a new worker would see all of them.
    assert [r["step"] for r in load_records(tmp_path / "run")] == list(range(1, 201))
    # The stream got the validated spec, the run's out_dir and the LPIPS weights path.
    (call,) = streams.calls
    assert isinstance(call["spec"], ArmSpec)
    assert call["out_dir"] == tmp_path / "run"
    assert call["lpips_weights"] == tmp_path / "alex.pth"
    # After done, a poll from the newest step returns nothing new but still says done.
    assert worker.poll(200, wait_s=0.01)["records"] == []


def test_poll_returns_only_newer_records(tmp_path: Path, streams: ModuleType) -> None:
    worker = make_worker(tmp_path, "gated")

    first = worker.poll(None, wait_s=5.0)
    assert [r["step"] for r in first["records"]] == [1]
    assert first["state"] == "running"
    # Nothing newer than step 1 while the stream is held: the long poll times out empty.
    idle = worker.poll(1, wait_s=0.05)
    assert idle["records"] == [] and idle["state"] == "running"

    streams.gate.set()
    got, final = poll_until_done(worker, after_step=1)
    assert [r["step"] for r in got] == [2, 3]
    assert final["state"] == "done"
    # A controller that restarted with an older after_step gets the re-send it needs.
    assert [r["step"] for r in worker.poll(None, wait_s=0.0)["records"]] == [1, 2, 3]
    assert [r["step"] for r in worker.poll(2, wait_s=0.0)["records"]] == [3]


def test_new_worker_offers_earlier_records_then_its_own(tmp_path: Path, streams: ModuleType) -> None:
    # An earlier worker died after step 30's checkpoint but before appending step 30 to records.jsonl.
    write_lines(tmp_path / RECORDS_NAME, [json.dumps({"step": s, "loss": s / 100}) + "\n" for s in (10, 20)])
    write_lines(tmp_path / METRICS_NAME, [json.dumps({"step": s, "loss": s / 100}) + "\n" for s in (10, 20, 30)])
    checkpoint_path(tmp_path, 30).touch()

    worker = make_worker(tmp_path, "resumed")
    got, final = poll_until_done(worker)

    assert [r["step"] for r in got] == [10, 20, 30, 40]
    assert final["state"] == "done"
    assert [r["step"] for r in load_records(tmp_path)] == [10, 20, 30, 40]


def test_record_after_a_kill9_stub_survives_a_reload(tmp_path: Path, streams: ModuleType) -> None:
    write_lines(tmp_path / RECORDS_NAME, [json.dumps({"step": 10}) + "\n", '{"step": 20, "lo'])
    worker = make_worker(tmp_path, "resumed")  # no metrics.jsonl: records.jsonl is the only copy
    got, final = poll_until_done(worker)
    assert [r["step"] for r in got] == [10, 40] and final["state"] == "done"
    assert [r["step"] for r in load_records(tmp_path)] == [10, 40]


def test_poll_reports_error_text_when_the_stream_raises(tmp_path: Path, streams: ModuleType) -> None:
    worker = make_worker(tmp_path, "raises")
    got, final = poll_until_done(worker)

    assert [r["step"] for r in got] == [1]  # the record before the failure is still delivered
    assert final["state"] == "error"
    first_line = final["error"].splitlines()[0]  # what the launcher puts in the run's reason
    # type and message, then where: the innermost frame outside the libraries (the stream that raised)
    assert first_line.startswith("RuntimeError: loss went nan at step 2 (at ") and " in raises)" in first_line
    assert "Traceback" in final["error"]


def test_bad_train_fn_is_an_error_not_a_hang(tmp_path: Path, streams: ModuleType) -> None:
    worker = make_worker(tmp_path, "no_such_function")
    _, final = poll_until_done(worker)
    assert final["state"] == "error"
    assert "no_such_function" in final["error"].splitlines()[0]


# -- request_stop ------------------------------------------------------------------------------------


def test_request_stop_reaches_the_stream_and_its_final_record_arrives(tmp_path: Path, streams: ModuleType) -> None:
    worker = make_worker(tmp_path, "until_stopped")
    first = worker.poll(None, wait_s=5.0)
    assert first["records"] and first["stopping"] is False

    worker.request_stop()
    got, final = poll_until_done(worker, after_step=max(int(r["step"]) for r in first["records"]))

    assert final["state"] == "done" and final["stopping"] is True
    (stopped_at,) = streams.stop_seen
    records = first["records"] + got
    assert [r["step"] for r in records] == list(range(1, stopped_at + 2))
    assert records[-1] == {"step": stopped_at + 1, "final": True}
    assert not any(r["final"] for r in records[:-1])


def test_a_record_that_breaks_the_protocol_fails_the_run_naming_its_field(tmp_path: Path, streams: ModuleType) -> None:
    """What the controller would refuse (and refuse the node with) fails the run on the worker instead,
    with the field and the step; the records before it are handed on, none after it."""
    records, final = poll_until_done(make_worker(tmp_path / "run", "mistyped"))
    assert [r["step"] for r in records] == [1]
    assert final["state"] == "error"
    assert final["error"].startswith("a record of step 2 breaks the protocol: train_loss"), final["error"]
