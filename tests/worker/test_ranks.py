"""A data-parallel arm on CPU (gloo, two processes): it matches its one-process twin at the same global
batch, rank 0 alone writes, a stop and a resume take every rank along, and a killed rank ends the arm."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from model.spec import ArmSpec
from orchestrator.grids.arms import deep_merge, resolve
from worker import checkpoint as ckpt
from worker.actor import ArmWorker
from worker.micro_batch import resumed_micro_batch
from worker.ranks import RankFailed, new_job, run_ranks
from worker.train import train_arm

# Measured on CPU (fp32, gloo, 2 ranks against 1, arm A tiny, batch 8, 12 steps): the largest relative
# difference of train_loss and val_flow_loss over the checkpoints was 7.5e-8 (summation order only).
# The bound leaves room for another CPU's kernels; a wrong slice of data or noise differs by ~1e-1.
MATCH_RTOL = 1e-4

SPEC: dict[str, Any] = {
    "model": {"size": "tiny"},
    "data": {"num_images": 64, "held_out": 4},  # one loader worker (CPU auto): forked beside the control thread
    "schedule": {"steps": 12, "batch_size": 8, "warmup_steps": 2, "checkpoint_every": 4, "ema": {"warmup_steps": 2}},
    "eval": {"num_samples": 2, "sampler_steps": 2, "lpips_backbone": "random_standin"},
}


def spec_for(gpus: int, **over: Any) -> ArmSpec:
    return resolve("A", deep_merge(deep_merge(SPEC, over), {"gpus": gpus}))


def ranks(spec: ArmSpec, out_dir: Path, should_stop: Any = lambda: False) -> Any:
    job = new_job(
        out_dir, spec.gpus, spec=spec.model_dump(mode="json"), lpips_weights=None, data_store=None, torch_threads=1,
        train_fn="worker.train:train_arm",
    )
    return run_ranks(job, should_stop)


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def test_two_ranks_match_one_process_at_the_same_global_batch(tmp_path: Path) -> None:
    one = list(train_arm(spec_for(1), tmp_path / "one"))
    two = list(ranks(spec_for(2), tmp_path / "two"))
    assert [r["step"] for r in two] == [r["step"] for r in one] == [4, 8, 12]
    for a, b in zip(two, one, strict=True):
        assert rel(a["train_loss"], b["train_loss"]) < MATCH_RTOL
        assert rel(a["val_flow_loss"], b["val_flow_loss"]) < MATCH_RTOL
        assert a["ranks"] == 2 and b["ranks"] == 1
        assert a["micro_batch"] == 4 and a["grad_accum"] == 1  # each rank: its half of the batch of 8
    # the other rank wrote nothing: one metrics line per checkpoint, rank 0's files only
    lines = (tmp_path / "two" / ckpt.METRICS_NAME).read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [4, 8, 12]
    assert not list((tmp_path / "two").glob(".ranks-*"))  # the process group's store is cleaned up


def test_a_stopped_arm_resumes_on_every_rank_as_if_never_stopped(tmp_path: Path) -> None:
    long = {"schedule": {"steps": 40, "checkpoint_every": 10}}
    whole = list(ranks(spec_for(2, **long), tmp_path / "whole"))
    seen: list[dict[str, Any]] = []
    for record in ranks(spec_for(2, **long), tmp_path / "cut", should_stop=lambda: bool(seen)):
        seen.append(record)
    assert seen[-1]["final"] is True and seen[-1]["step"] < 40
    resumed = list(ranks(spec_for(2, **long), tmp_path / "cut"))
    assert resumed[0]["resumed_from_step"] == seen[-1]["step"] and resumed[-1]["step"] == 40
    assert resumed[-1]["train_loss"] == whole[-1]["train_loss"]
    assert resumed[-1]["val_flow_loss"] == whole[-1]["val_flow_loss"]


def _children_running(module: str) -> dict[int, list[str]]:
    """Our child processes running `python -m module`, by pid (no psutil here: /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and module in argv:
            found[int(entry.name)] = argv
    return found


def test_a_killed_rank_fails_the_whole_arm(tmp_path: Path) -> None:
    spec = spec_for(2, schedule={"steps": 100000, "checkpoint_every": 2})
    stream = ranks(spec, tmp_path)
    first = next(stream)  # both ranks are training
    assert first["step"] == 2
    rank1 = [pid for pid, argv in _children_running("worker.ranks").items() if argv[-2] == "1"]
    assert len(rank1) == 1
    os.kill(rank1[0], signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(RankFailed, match="rank 1 of 2 was killed by signal 9"):
        for _ in stream:
            pass
    assert time.monotonic() - t0 < 60
    assert _children_running("worker.ranks") == {}  # rank 0 did not train on alone


def test_the_actor_runs_a_two_gpu_arm_and_reports_a_failing_rank(tmp_path: Path) -> None:
    """Through ArmWorker (the node agent's actor) as a one-GPU arm is: records in order, then done; an
    arm that cannot start fails with the rank's own message, once."""
    worker = ArmWorker(1, spec_for(2).model_dump(mode="json"), str(tmp_path / "ok"), torch_threads=1)
    reply = _poll_until_done(worker)
    assert reply["state"] == "done" and [r["step"] for r in reply["records"]] == [4, 8, 12]
    bad = spec_for(2).model_dump(mode="json")
    bad["data"] = {**bad["data"], "dataset": "imagefolder", "path": str(tmp_path / "missing")}
    worker = ArmWorker(2, bad, str(tmp_path / "bad"), torch_threads=1)
    reply = _poll_until_done(worker)
    assert reply["state"] == "error" and reply["error"].startswith("rank ")
    assert "missing" in reply["error"]


def _poll_until_done(worker: ArmWorker, timeout_s: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reply = worker.poll(None, wait_s=1.0)
        if reply["state"] != "running":
            return reply
    raise AssertionError("the worker did not finish")


# Measured (CPU, fp32, gloo, arm A tiny, batch 8): 1 GPU for 6 steps then 2 ranks to step 12, against 2 ranks
# from the start: train_loss and val_flow_loss at step 12 equal to the last bit (0.0 relative difference; the
# ranks' summation order moves a loss by 1e-7 at most, as above). Bound: the issue's 5% (the 2-GPU parity);
# a resume that drew other data or noise, or dropped the optimizer state, differs by far more.
GROWN_RTOL = 0.05


def test_an_arm_grown_from_one_gpu_to_two_at_a_checkpoint_ends_as_its_two_gpu_twin(tmp_path: Path) -> None:
    twin = list(ranks(spec_for(2), tmp_path / "twin"))
    done: list[int] = []
    one = list(train_arm(spec_for(1), tmp_path / "grown", should_stop=lambda: bool(done) and done[-1] >= 6,
                         on_step=lambda step, _loss: done.append(step)))
    assert one[-1]["final"] is True and one[-1]["step"] == 6 and one[-1]["ranks"] == 1
    grown = list(ranks(spec_for(2), tmp_path / "grown"))  # the same directory, at twice the world size
    assert grown[0]["resumed_from_step"] == 6 and {r["ranks"] for r in grown} == {2}
    assert grown[0]["micro_batch"] == 4  # the one GPU's micro-batch of 8, split between the two ranks
    for key in ("train_loss", "val_flow_loss"):
        diff = rel(grown[-1][key], twin[-1][key])
        print(f"grown 1->2 at step 6 vs 2-rank twin, {key} at step 12: relative difference {diff:.2e}")
        assert diff < GROWN_RTOL
    # the series continues: every step once, in order, the one GPU's and the two ranks' records together
    lines = (tmp_path / "grown" / ckpt.METRICS_NAME).read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [4, 6, 8, 12]
    assert [json.loads(x)["ranks"] for x in lines] == [1, 1, 2, 2]


def test_a_resumed_micro_batch_keeps_the_images_per_micro_batch_over_all_ranks() -> None:
    big = spec_for(4, schedule={"batch_size": 16})
    assert resumed_micro_batch(8, 1, spec_for(1)) == 8  # the same world size: as written
    assert resumed_micro_batch(8, 1, spec_for(2)) == 4  # grown 1 -> 2: 8 images per micro-batch still
    assert resumed_micro_batch(2, 2, big) == 1  # 2 -> 4 GPUs
    assert resumed_micro_batch(1, 1, spec_for(2)) is None  # one image cannot be split: chosen afresh
    assert resumed_micro_batch(4, 2, spec_for(1)) is None  # fewer GPUs: what fits is measured again
    assert resumed_micro_batch(None, 1, spec_for(2)) is None  # a fresh start
