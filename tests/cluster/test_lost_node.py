"""A node is lost mid-grid and its arms resume on the other node from checkpoint storage.

On the test bed: two namespace nodes joined to the token-auth Ray head over real SSH, the real
scheduler in its own process (the controller declares no GPUs), checkpoints stored in an
S3-compatible server (moto) that listens on the controller's bridge address, with the usual AWS
credentials file in each node user's home. While the arms train, one node is killed: its Ray
processes (SIGKILL), then its link. Its arms re-queue, resume on the surviving node from the newest
checkpoint in S3 (the survivor's disk has none of theirs), and finish with every metric present
once; each arm's results equal an uninterrupted run of the same spec on CPU, value for value.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import select

from orchestrator.db.models import Event, Metric, Run
from orchestrator.db.session import session_scope
from orchestrator.fleet.bootstrap import bootstrap_node
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.vocabulary import RunState
from tests.cluster.testbed import TestBed
from tests.kit.bed import BUCKET, aws_profile, launcher_process, lose_node, node_config, register_node
from tests.kit.polling import wait_for
from tests.kit.readers import all_ended, runs_of, stored_step
from tests.kit.settings import bed_overrides

TINY = bed_overrides(steps=80, checkpoint_every=10)
@pytest.fixture(scope="module")
def cluster(database_url: str, testbed: TestBed, s3_on_bridge: str) -> Iterator[dict[str, Any]]:
    """Both nodes joined for real, and the launcher in its own process storing checkpoints in S3."""
    for node in testbed.nodes:
        aws_profile(node)
        bootstrap_node(database_url, register_node(database_url, node), node_config(testbed))
    log = testbed.root / "scheduler-lost.log"
    options = {
        "ABLATE_CHECKPOINT_URL": f"s3://{BUCKET}/nightly",
        "ABLATE_CHECKPOINT_OPTIONS": json.dumps({"endpoint_url": s3_on_bridge}),
        "ABLATE_CHECKPOINT_KEEP_LAST": "1",
    }
    storage = testbed.storage  # type: ignore[attr-defined]
    with launcher_process(database_url, storage, log, "ablate-lost", **options):
        yield {"endpoint": s3_on_bridge, "log": log}


def _uninterrupted(spec: dict[str, Any], out: Path) -> list[dict[str, Any]]:
    """The same spec trained straight through on CPU, one thread, as the node workers do."""
    from model.spec import ArmSpec
    from worker.train import train_arm

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return list(train_arm(ArmSpec.model_validate(spec), out))
    finally:
        torch.set_num_threads(before)


def test_a_lost_node_s_arms_resume_on_the_other_node_from_storage(
    database_url: str, testbed: TestBed, cluster: dict[str, Any], tmp_path: Path
) -> None:
    log = cluster["log"]
    with session_scope(database_url) as session:
        grid = create_grid(session, GridCreate(name="lost-node", arms=["A", "B"], overrides=TINY))
        ids = [r.id for r in grid.runs]
    # Both arms running, each with two checkpoints already in S3.
    stored_twice = lambda: all(stored_step(database_url, i) >= 20 for i in ids)  # noqa: E731
    wait_for(stored_twice, "two stored checkpoints per arm", 240, 0.3, log)
    runs = runs_of(database_url, ids)
    assert all(r.state == RunState.running for r in runs), [(r.arm, r.state, r.error) for r in runs]
    victim = next(n for n in testbed.nodes if n.name == runs[0].nodes[-1])  # run.nodes: the nodes' names
    survivor = next(n for n in testbed.nodes if n is not victim)
    on_victim = [r.id for r in runs if r.nodes[-1] == victim.name]
    stored_at_loss = {i: stored_step(database_url, i) for i in on_victim}
    lose_node(testbed, victim)

    wait_for(lambda: all_ended(database_url, ids), "both arms to finish", 420, 0.3, log)
    with session_scope(database_url) as session:
        for run in session.scalars(select(Run).where(Run.id.in_(ids))):
            assert run.state == RunState.completed, (run.arm, run.state, run.error)
            steps = list(session.scalars(select(Metric.step).where(Metric.run_id == run.id).order_by(Metric.step)))
            assert steps == list(range(10, 81, 10)), (run.arm, steps)  # contiguous, none twice
            events = list(session.scalars(select(Event).where(Event.run_id == run.id).order_by(Event.id)))
            fetched = [e for e in events if e.kind == "checkpoint.fetched"]
            if run.id in on_victim:
                # Re-queued once, resumed on the survivor from the newest checkpoint stored in S3.
                assert run.retries == 1, run.arm
                assert run.nodes == [victim.name, survivor.name]
                assert len(fetched) == 1 and fetched[0].data["step"] >= stored_at_loss[run.id]
                assert fetched[0].data["url"] == run.checkpoint_url
            else:
                assert run.retries == 0 and fetched == [] and run.nodes[-1] == survivor.name
            # The same values as the same spec trained without interruption on CPU.
            straight = _uninterrupted(run.spec, tmp_path / run.arm)
            metrics = session.scalars(select(Metric).where(Metric.run_id == run.id).order_by(Metric.step)).all()
            for m, r in zip(metrics, straight, strict=True):
                assert (m.step, m.train_loss, m.grad_norm, m.recon_lpips, m.text_lpips) == (
                    r["step"], r["train_loss"], r["grad_norm"], r["recon_lpips"], r["text_lpips"]
                ), run.arm
            url = run.checkpoint_url
            assert url.startswith(f"s3://{BUCKET}/nightly/run-{run.id}-")
            from worker.checkpoint_store import open_fs

            fs, root = open_fs(url, {"endpoint_url": cluster["endpoint"]})
            assert sorted(n.rsplit("/", 1)[-1] for n in fs.ls(root, detail=False)) == [
                "best.pt", "ckpt_0000080.pt", "metrics.jsonl", "records.jsonl", "samples"
            ]  # samples/: every evaluation's images (worker/checkpoint_store.py)
            stored = torch.load(fs.open(f"{root}/ckpt_0000080.pt"), weights_only=False)
            local = torch.load(tmp_path / run.arm / "ckpt_0000080.pt", weights_only=False)
            assert all(torch.equal(stored["model"][k], local["model"][k]) for k in local["model"])
    assert on_victim, "the lost node ran at least one arm"
