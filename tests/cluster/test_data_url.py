"""A rented node trains from data.url: prepared shards in S3 (moto on the controller's bridge address),
a namespace node with two GPUs and an empty disk, joined to the token-auth Ray head over real SSH, the
real scheduler placing two arms on it. The node's arms fetch the shards once into its own data cache
(one arm downloads, the other waits on the lock and finds them complete), verified against the manifest,
and both train to the end from the one copy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select

from model.data.prepare import prepare
from orchestrator.db.models import Metric, Run
from orchestrator.db.session import session_scope
from orchestrator.fleet.bootstrap import bootstrap_node
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.vocabulary import RunState
from tests.cluster.testbed import TestBed
from tests.kit.bed import BUCKET, aws_profile, launcher_process, node_config, register_node
from tests.kit.photos import SHARDS, photos
from tests.kit.polling import wait_for
from tests.kit.readers import all_ended
from tests.kit.settings import bed_overrides
from worker.checkpoint_store import open_fs

pytestmark = pytest.mark.bed(nodes=1)  # both arms land on its two GPUs and share its cache

URL = f"s3://{BUCKET}/datasets/photos-16"
TINY = {
    **bed_overrides(steps=20, checkpoint_every=10),
    "data": {"dataset": "prepared", "url": URL, "resolution": 16, "held_out": 2},
}


def test_a_node_fetches_data_url_once_and_its_arms_train_from_it(
    database_url: str, testbed: TestBed, s3_on_bridge: str, tmp_path: Path
) -> None:
    prepared = tmp_path / "prepared"
    prepare(photos(tmp_path / "src"), prepared, 16, shard_bytes=3 * 16 * 16 * 4)
    options = {"endpoint_url": s3_on_bridge}
    fs, _ = open_fs(URL, options)
    for name in ["manifest.json", "captions.jsonl", *SHARDS]:
        fs.put_file(str(prepared / name), f"{URL.removeprefix('s3://')}/{name}")

    (node,) = testbed.nodes
    aws_profile(node)
    bootstrap_node(database_url, register_node(database_url, node), node_config(testbed))
    log = testbed.root / "scheduler-data-url.log"
    storage: Path = testbed.storage  # type: ignore[attr-defined]
    env = {"ABLATE_DATA_OPTIONS": json.dumps(options)}  # checkpoints stay on the node's disk (file://)
    with launcher_process(database_url, storage, log, "ablate-data-url", **env):
        with session_scope(database_url) as session:
            grid = create_grid(session, GridCreate(name="data-url", arms=["A", "B"], overrides=TINY))
            ids = [r.id for r in grid.runs]

        wait_for(lambda: all_ended(database_url, ids), "both arms to finish", 420, 0.3, log)

    fetches = []
    with session_scope(database_url) as session:
        for run in session.scalars(select(Run).where(Run.id.in_(ids))):
            assert run.state == RunState.completed, (run.arm, run.state, run.error)
            assert run.nodes == [node.name]
            extras = session.scalars(select(Metric.extra).where(Metric.run_id == run.id).order_by(Metric.step)).all()
            assert len(extras) == 2 and all(e["data_fetch"] == extras[0]["data_fetch"] for e in extras)
            fetches.append(extras[0]["data_fetch"])
    # One download for the node: the other arm found the verified copy complete.
    assert sorted(len(f["downloaded"]) for f in fetches) == [0, len(SHARDS) + 1]
    cache = Path(fetches[0]["path"])
    assert fetches[1]["path"] == str(cache) and cache.parent == (storage / "data-cache").resolve()
    on_node = node.private[storage] / cache.relative_to(storage.resolve())  # the node's own disk, seen from here
    for name in ["manifest.json", *SHARDS]:
        assert (on_node / name).read_bytes() == (prepared / name).read_bytes(), name
