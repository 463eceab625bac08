"""A rented night with the researcher's own trainer beside arm A: a schedule whose grid holds a command arm
(examples/your-trainer/train.py, copied) fires, the runner rents a node from the provider simulator (a
real namespace node of the test bed), the controller copies the code to it over SSH, both arms train
there, and the results copied back hold the command arm's checkpoints and its checkpoints/ folder.

The code lies in a folder of the controller that the node's user cannot read: it reaches the node only
as the archive the controller sends. Only the provider's HTTP API is simulated.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from orchestrator.db.models import Event, Grid, Run, Sweep
from orchestrator.db.session import session_scope
from orchestrator.grids.service import PathPolicy
from orchestrator.vocabulary import RunState, SweepState
from tests.cluster.provider_hooks import bed_hooks
from tests.cluster.provider_sim import ProviderSim
from tests.cluster.provider_wire import vast_offer
from tests.cluster.rental import bed_rental, due_rented_night, vast_runner
from tests.cluster.testbed import TestBed
from tests.kit.bed import launcher_process
from tests.kit.settings import tiny_overrides

pytestmark = pytest.mark.bed(nodes=0)  # no nodes of its own: every node comes from a rental

pytest.importorskip("vastai", reason="the vastai SDK: pip install --no-deps vastai==1.9.1 runpod==1.12.0")

KEY = "sk-rented-command-arm-0123456789"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "your-trainer"


def test_a_rented_night_runs_the_researchers_trainer_beside_arm_a_and_copies_it_back(
    database_url: str, testbed: TestBed, tmp_path: Path
) -> None:
    bed, storage = testbed, testbed.storage  # type: ignore[attr-defined]
    researcher = bed.root / "researcher"
    researcher.mkdir(mode=0o700)  # root's: no node user can read it
    code = researcher / "your-trainer"
    shutil.copytree(EXAMPLE, code)
    mine = {"name": "mine", "code": str(code), "detector": {"metric": "val_loss"},
            "command": [sys.executable, "train.py", "--steps", "200", "--every", "50"]}  # fmt: skip
    with session_scope(database_url) as session:
        due_rented_night(session, "rented-yours", ["A", mine], tiny_overrides(20), nodes=1)  # type: ignore[list-item]

    with ProviderSim(KEY, vast_offers=[vast_offer(601, dph_total=1.2)], hooks=bed_hooks(bed, gpus=lambda i: 2)) as sim:
        rental = bed_rental(bed.tag, tmp_path / "controller")
        paths = PathPolicy(allow_commands=True, command_dirs=[researcher])
        runner = vast_runner(database_url, storage, bed, KEY, sim.url, rental, paths=paths)
        log = tmp_path / "launcher.log"
        commands = {"ABLATE_ALLOW_COMMANDS": "1", "ABLATE_COMMAND_DIRS": json.dumps([str(researcher)])}
        with launcher_process(database_url, storage, log, "ablate-rented-command", **commands):
            runner.tick()  # fire: rent, pin, register, bootstrap; submit the grid
            deadline = time.monotonic() + 300
            while True:
                with session_scope(database_url) as session:
                    sweep = session.scalars(select(Sweep)).one()
                if sweep.state in (SweepState.completed, SweepState.failed, SweepState.stopped):
                    break
                assert time.monotonic() < deadline, f"sweep still {sweep.state}; launcher: {log.read_text()[-3000:]}"
                runner.tick()
                time.sleep(1.0)
        assert sim.live() == [], "the night's node is destroyed"

    assert sweep.state == SweepState.completed, sweep.error
    with session_scope(database_url) as session:
        a, command = session.get_one(Grid, sweep.grid_id).runs
        started = session.scalars(select(Event).where(Event.run_id == command.id, Event.kind == "started")).one()
        steps = list(session.scalars(select(Run.last_checkpoint_step).where(Run.id == command.id)))
    assert (a.state, command.state) == (RunState.completed, RunState.completed), command.error
    assert started.data["node_name"].startswith("vast-") and steps == [200]
    back = Path(sweep.results_dir) / "runs" / f"{command.id}-mine"
    assert (back / "best.pt").is_file()
    assert (back / "run" / "checkpoints" / "step_000050.pt").is_file(), sorted(back.rglob("*"))
