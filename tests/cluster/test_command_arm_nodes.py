"""A researcher's own trainer, copied from examples/your-trainer, runs as command arms beside arm A on the
test bed's joined nodes: the detector stops the diverging copy through its stop file and keeps its best
checkpoint in storage; the healthy copy's node is killed mid-run and the arm resumes on the other node from
storage, its checkpoints/ folder restored and ABLATE_RESUMED=1.

The code lives in a folder of the controller that no node user can read: it reaches the nodes only as
the archive the controller copies over each node's SSH connection. Checkpoints go to S3 (moto on the
controller's bridge address), the launcher runs in its own process, as in test_lost_node.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import select

from orchestrator.db.models import Metric
from orchestrator.db.session import session_scope
from orchestrator.fleet.bootstrap import bootstrap_node
from orchestrator.grids.service import GridCreate, PathPolicy, create_grid
from tests.cluster.testbed import TestBed
from tests.kit.bed import BUCKET, aws_profile, launcher_process, lose_node, node_config, register_node
from tests.kit.polling import wait_for
from tests.kit.readers import all_ended, events_of, runs_of, stored_step
from tests.kit.settings import tiny_overrides
from worker.checkpoint_store import open_fs

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "your-trainer"
# The researcher's copy, changed two ways: each optimizer step waits PACE_S seconds (so a node can be
# killed mid-run), and a note no metrics line names sits in checkpoints/ (a resume must find it there).
PACED = '''
import os, pathlib, runpy, sys, time
import torch
ckpts = pathlib.Path(os.environ["ABLATE_RUN_DIR"]) / "checkpoints"
note = ckpts / "first-attempt.txt"
if os.environ["ABLATE_RESUMED"] == "1" and not note.exists():
    sys.exit("checkpoints/first-attempt.txt was not restored")
ckpts.mkdir(parents=True, exist_ok=True)
note.exists() or note.write_text("written by the first attempt")
step = torch.optim.SGD.step
def paced(self, *args, **kwargs):
    time.sleep(float(os.environ["PACE_S"]))
    return step(self, *args, **kwargs)
torch.optim.SGD.step = paced
sys.argv[0] = "train.py"
runpy.run_path("train.py", run_name="__main__")
'''


@pytest.fixture(scope="module")
def code(testbed: TestBed) -> Path:
    """The researcher's folder on the controller: root's, closed to every node user."""
    root = testbed.root / "researcher"
    root.mkdir(mode=0o700)
    shutil.copytree(EXAMPLE, root / "your-trainer")
    (root / "your-trainer" / "paced.py").write_text(PACED)
    return root / "your-trainer"


@pytest.fixture(scope="module")
def cluster(database_url: str, testbed: TestBed, s3_on_bridge: str, code: Path) -> Iterator[dict[str, Any]]:
    for node in testbed.nodes:
        aws_profile(node)
        bootstrap_node(database_url, register_node(database_url, node), node_config(testbed))
    log = testbed.root / "scheduler-command.log"
    settings = {
        "ABLATE_CHECKPOINT_URL": f"s3://{BUCKET}/command",
        "ABLATE_CHECKPOINT_OPTIONS": json.dumps({"endpoint_url": s3_on_bridge}),
        "ABLATE_ALLOW_COMMANDS": "1",
        "ABLATE_COMMAND_DIRS": json.dumps([str(code.parent)]),
        "ABLATE_NODE_LOST_S": "8",
    }
    with launcher_process(database_url, testbed.storage, log, "ablate-command", **settings):  # type: ignore[attr-defined]
        yield {"endpoint": s3_on_bridge, "log": log}


def test_command_arms_beside_arm_a_on_joined_nodes_stop_keep_best_and_resume_from_storage(
    database_url: str, testbed: TestBed, cluster: dict[str, Any], code: Path
) -> None:
    log = cluster["log"]
    paced = [sys.executable, "paced.py", "--every", "25"]
    mine = {"name": "mine", "code": str(code), "command": [*paced, "--steps", "300"], "env": {"PACE_S": "0.05"},
            "detector": {"metric": "val_loss"}}  # fmt: skip
    broken = {**mine, "name": "mine-broken", "command": [*paced, "--steps", "10000000", "--diverge-at", "100"]}
    with session_scope(database_url) as session:
        policy = PathPolicy(allow_commands=True, command_dirs=[code.parent])
        grid = create_grid(session, GridCreate(name="yours", arms=["A", mine, broken], overrides=tiny_overrides(20)),
                           paths=policy)  # fmt: skip
        ids = [r.id for r in grid.runs]
    a_id, mine_id, broken_id = ids

    wait_for(lambda: stored_step(database_url, mine_id) >= 100, "mine's checkpoint of step 100 in S3", 180, 0.3, log)
    (running,) = runs_of(database_url, [mine_id])
    victim = next(n for n in testbed.nodes if n.name == running.nodes[-1])
    survivor = next(n for n in testbed.nodes if n is not victim)
    stored_at_loss = stored_step(database_url, mine_id)
    lose_node(testbed, victim)
    wait_for(lambda: all_ended(database_url, ids), "the grid to end", 300, 0.3, log)

    a, good, bad = runs_of(database_url, ids)
    assert (a.state, good.state) == ("completed", "completed"), (a.error, good.error)
    # The healthy copy: lost with its node, resumed on the other one from storage, every step once.
    assert good.retries == 1 and good.nodes == [victim.name, survivor.name], good.nodes
    with session_scope(database_url) as session:
        steps = list(session.scalars(select(Metric.step).where(Metric.run_id == good.id).order_by(Metric.step)))
    assert steps == list(range(25, 301, 25))
    fetched = [e for e in events_of(database_url, good.id) if e.kind == "checkpoint.fetched"]
    assert len(fetched) == 1 and fetched[0].data["step"] >= stored_at_loss
    out = survivor.private[testbed.storage] / "runs" / str(good.id)  # type: ignore[attr-defined]
    assert f"resumed from step_{fetched[0].data['step']:06d}.pt" in (out / "stdout.log").read_text()
    assert (out / "run" / "checkpoints" / "first-attempt.txt").read_text() == "written by the first attempt"

    # The diverging copy: stopped by the detector through its stop file, its best checkpoint kept in S3.
    assert bad.state == "stopped" and bad.decision in {"collapse", "diverged"}, (bad.state, bad.error)
    assert events_of(database_url, bad.id)[-1].data["ended_by"] == "stop_file"
    assert bad.best_step is not None and 100 <= bad.decision_step and bad.best_step < bad.decision_step
    fs, root = open_fs(bad.checkpoint_url, {"endpoint_url": cluster["endpoint"]})
    assert torch.load(fs.open(f"{root}/best.pt"), weights_only=True)["step"] == bad.best_step

    # The code reached each node only as the archive the controller copied there: no node user can read
    # the controller's folder.
    for node in testbed.nodes:
        denied = subprocess.run(["runuser", "-u", node.user, "--", "ls", str(code)], capture_output=True)
        assert denied.returncode != 0
    assert len(list((survivor.home / "ablate" / "code").glob("*.tar"))) == 1
    assert len(list((victim.home / "ablate" / "code").glob("*.tar"))) == 1
