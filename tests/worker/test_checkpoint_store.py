"""Durable checkpoint storage from the worker's side, with the real trainer (tiny arm, CPU) and real stores:
a file:// directory and an S3-compatible server (moto in server mode on loopback; s3fs talks HTTP to it
exactly as to a cloud bucket). ArmWorker runs as a plain object here; the launcher and SFTP tests are in
tests/orchestrator/test_checkpoint_storage.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from model.spec import ArmSpec
from orchestrator.grids.arms import deep_merge, resolve
from tests.kit.polling import done_reply, wait_for
from tests.kit.settings import tiny_overrides
from worker.actor import ArmWorker
from worker.checkpoint_store import CheckpointStore, StoreConfig, open_fs, stored_checkpoints

TINY = tiny_overrides(30)


def spec(**over: Any) -> dict[str, Any]:
    s: ArmSpec = resolve("A", deep_merge(TINY, over))
    return s.model_dump(mode="json")


def stored_names(url: str, options: dict[str, Any] | None = None) -> list[str]:
    fs, root = open_fs(url, options)
    fs.invalidate_cache()
    return sorted(n.rsplit("/", 1)[-1] for n in fs.ls(root, detail=False))


def test_checkpoints_are_stored_and_pruned_to_keep_last(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'store' / 'run-1'}"
    worker = ArmWorker(1, spec(), str(tmp_path / "node"), storage={"url": url, "keep_last": 1})
    reply = done_reply(worker)
    assert [r["step"] for r in reply["records"]] == [10, 20, 30]
    assert stored_names(url) == ["best.pt", "ckpt_0000030.pt", "metrics.jsonl", "records.jsonl", "samples"]
    store = tmp_path / "store" / "run-1"
    local = tmp_path / "node"
    # Every evaluation's sample images, never pruned (steps 10 and 20 were superseded before upload or not).
    for rec in reply["records"]:
        for f in rec["samples"]["files"]:
            path = Path(rec["samples"]["dir"]) / f["file"]
            assert (store / path).read_bytes() == (local / path).read_bytes()
    assert (store / "ckpt_0000030.pt").read_bytes() == (local / "ckpt_0000030.pt").read_bytes()
    assert (store / "best.pt").read_bytes() == (local / "best.pt").read_bytes()
    assert (store / "records.jsonl").read_text() == (local / "records.jsonl").read_text()
    status = reply["storage"]
    assert status["stored_step"] == 30 and status["failures"] == 0 and status["pending_step"] is None
    kinds = [e["kind"] for e in status["log"]]
    assert set(kinds) == {"checkpoint.stored"} and [e["seq"] for e in status["log"]] == list(range(1, len(kinds) + 1))
    assert status["log"][-1]["data"]["step"] == 30
    assert not any((local / ".upload").iterdir()), "every staged link is released after its upload"


def test_a_new_node_resumes_from_storage_bit_identically(tmp_path: Path) -> None:
    """Node 1 stops after its first checkpoint; node 2 has an empty disk and resumes from storage. Its
    records continue the first node's with no step lost or repeated, and every value equals an
    uninterrupted run's (the CPU trainer is bit-identical)."""
    url = f"file://{tmp_path / 'store' / 'run-2'}"
    first = ArmWorker(2, spec(), str(tmp_path / "node1"), storage={"url": url})
    wait_for(lambda: first.poll(None, 0.5)["records"], "a first checkpoint")
    first.request_stop()
    stopped = done_reply(first)
    stop_step = stopped["records"][-1]["step"]
    assert stop_step < 30 and stopped["storage"]["stored_step"] == stop_step

    second = ArmWorker(2, spec(), str(tmp_path / "node2"), storage={"url": url})
    done = done_reply(second)
    steps = [r["step"] for r in done["records"]]
    # The graceful stop wrote one checkpoint off the 10-step grid; nothing is lost or repeated.
    assert steps == sorted({10, 20, 30, stop_step}), "records from storage, then the new node's, each once"
    fetched = [e for e in done["storage"]["log"] if e["kind"] == "checkpoint.fetched"]
    assert [e["data"]["step"] for e in fetched] == [stop_step]
    new = [r for r in done["records"] if r["step"] > stop_step]
    assert all(r["resumed_from_step"] == stop_step for r in new)

    straight = done_reply(ArmWorker(3, spec(), str(tmp_path / "straight")))
    # The weights match at every checkpoint (LPIPS of the same seeded samples); the loss and grad-norm
    # averages too, except over the window that the off-grid stop checkpoint cut short.
    cut = {s for s in (20, 30) if stop_step % 10 and stop_step < s <= stop_step + 10 - stop_step % 10}
    resumed = {r["step"]: r for r in done["records"]}
    for r in straight["records"]:
        keys = ("recon_lpips", "text_lpips") + (() if r["step"] in cut else ("train_loss", "grad_norm"))
        assert [resumed[r["step"]][k] for k in keys] == [r[k] for k in keys], (r["step"], stop_step)
    a = torch.load(tmp_path / "node2" / "ckpt_0000030.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "straight" / "ckpt_0000030.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_node_with_an_older_checkpoint_takes_the_newer_one_from_storage(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'store'}"
    node = tmp_path / "node"
    done_reply(ArmWorker(4, spec(), str(node), storage={"url": url, "keep_last": 3}))
    for name in ("ckpt_0000030.pt", "ckpt_0000020.pt"):  # the node lost its newest checkpoints
        (node / name).unlink()
    store = CheckpointStore(StoreConfig(url=url), node)
    fetched = store.fetch_latest()
    assert fetched is not None and fetched["step"] == 30
    assert (node / "ckpt_0000030.pt").read_bytes() == (tmp_path / "store" / "ckpt_0000030.pt").read_bytes()
    assert store.fetch_latest() is None, "nothing newer in storage now"


# -- S3: a real S3-compatible server on loopback ------------------------------------------------------


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The usual AWS variables (moto accepts any key); nothing may reach a real AWS endpoint.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ablate-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ablate-test-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def test_s3_store_retries_while_the_bucket_is_missing_and_training_goes_on(
    s3_endpoint: str, aws_env: None, tmp_path: Path
) -> None:
    """The bucket does not exist yet: every upload fails and is logged with its error, yet the trainer
    yields all its checkpoints (uploads never stall it). Once the bucket exists a retry stores the
    newest checkpoint (older pending ones were superseded), and only then does the worker report done."""
    options = {"endpoint_url": s3_endpoint}
    url = "s3://ablate-late-bucket/ckpts/run-5"
    worker = ArmWorker(5, spec(), str(tmp_path / "node"), storage={"url": url, "options": options, "keep_last": 1})
    trained = wait_for(lambda: len((r := worker.poll(None, 0.5))["records"]) == 3 and r, "all three checkpoints")
    assert trained["state"] == "running", "the worker is still storing its checkpoints"
    failing = wait_for(lambda: (r := worker.poll(None, 0.1))["storage"]["failures"] and r, "a failed upload")
    status = failing["storage"]
    assert status["stored_step"] is None and status["failing_since"] is not None
    assert "bucket" in status["last_error"].lower()
    failed = [e for e in status["log"] if e["kind"] == "checkpoint.store_failed"]
    assert failed and failed[0]["data"]["retry_in_s"] >= 1

    fs, _ = open_fs("s3://ablate-late-bucket", options)
    fs.mkdir("ablate-late-bucket")
    done = done_reply(worker)
    assert done["storage"]["stored_step"] == 30 and done["storage"]["failures"] == 0
    assert stored_names(url, options) == ["best.pt", "ckpt_0000030.pt", "metrics.jsonl", "records.jsonl", "samples"]
    fs.invalidate_cache()
    assert fs.cat_file("ablate-late-bucket/ckpts/run-5/ckpt_0000030.pt") == (
        tmp_path / "node" / "ckpt_0000030.pt"
    ).read_bytes()


def test_s3_resume_on_a_fresh_node(s3_endpoint: str, aws_env: None, tmp_path: Path) -> None:
    options = {"endpoint_url": s3_endpoint}
    fs, _ = open_fs("s3://ablate-resume", options)
    fs.mkdir("ablate-resume")
    url = "s3://ablate-resume/run-6"
    first = ArmWorker(6, spec(), str(tmp_path / "node1"), storage={"url": url, "options": options})
    wait_for(lambda: first.poll(None, 0.5)["records"], "a first checkpoint")
    first.request_stop()
    stop_step = done_reply(first)["records"][-1]["step"]
    fs_run, root = open_fs(url, options)
    assert [s for s, _ in stored_checkpoints(fs_run, root)][-1] == stop_step
    done = done_reply(ArmWorker(6, spec(), str(tmp_path / "node2"), storage={"url": url, "options": options}))
    assert [r["step"] for r in done["records"]] == sorted({10, 20, 30, stop_step})
    assert any(e["kind"] == "checkpoint.fetched" and e["data"]["step"] == stop_step for e in done["storage"]["log"])
