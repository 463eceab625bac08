"""A rented night's latencies on the namespace test bed, through the provider simulator, as root on Linux.

A schedule asks for two nodes (not names); the sweep runner rents them through the real vastai SDK from
tests/cluster/provider_sim.py, whose instances are real namespace nodes (own sshd, own address), pins
their host keys, arms the dead-man's switch, bootstraps them (each starts its own Ray, reached through its
agent over SSH), and the real launcher (its own process) trains five tiny arms; results are copied back
and the instances destroyed.
Measured per sweep:
  - fire -> first optimizer step: the fire tick to the first metric row at step 1 (checkpoint_every=1),
    renting both nodes included;
  - last result -> destroy confirmed: the sweep's last metric row to the last instance's
    `destroy_confirmed_at` (copy-back, leave, destroy, the provider's confirmation);
  - record -> database: for every checkpoint, its line appearing in the worker's records.jsonl on the
    node's disk (watched every 20 ms) to its metric row's created_at (agent poll, SSH, ingest);
and once, after the sweeps:
  - a leaked instance found and destroyed: an instance labelled for a sweep that is not under way is
    planted, then a new controller process (tests/cluster/rented_controller.py: launcher + sweep
    runner, as `ablate serve`) starts; seconds from its start to the simulator's destroy.

    python bench/rented_night.py [--repeats 2] [--out docs/bench-results/rented_night.md]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import func, select  # noqa: E402

from bench.cluster_sweep import bench_bed, median_table  # noqa: E402
from orchestrator.db.models import Grid, Metric, RentedInstance, Run, Schedule, Sweep  # noqa: E402
from orchestrator.db.session import session_scope  # noqa: E402
from orchestrator.fleet.providers.base import InstanceLabel, LaunchSpec  # noqa: E402
from orchestrator.fleet.providers.request import NodeRequest  # noqa: E402
from orchestrator.fleet.providers.vast import VastProvider  # noqa: E402
from orchestrator.sweeps.runner import SweepRunner  # noqa: E402
from orchestrator.vocabulary import ACTIVE_SWEEP_STATES, SweepState  # noqa: E402
from tests.cluster.provider_hooks import bed_hooks  # noqa: E402
from tests.cluster.provider_sim import ProviderSim  # noqa: E402
from tests.cluster.provider_wire import vast_offer  # noqa: E402
from tests.cluster.rental import BED_REQUEST, bed_rental, due_rented_night, vast_runner  # noqa: E402
from tests.cluster.rented_controller import controller_env  # noqa: E402
from tests.cluster.testbed import TestBed  # noqa: E402
from tests.kit.bed import launcher_process  # noqa: E402
from tests.kit.settings import tiny_overrides  # noqa: E402

KEY = "sk-bench-rented-night-0123456789"
TINY = tiny_overrides(5, checkpoint_every=1, batch_size=2, num_images=32, warmup_steps=1)
ARMS = ["A", "B", "C", {"parent": "A", "name": "A2"}, {"parent": "A", "name": "A3"}]


class RecordWatch(threading.Thread):
    """When each checkpoint record first appears on a node's disk: (run id, step) -> time.time()."""

    def __init__(self, bed: TestBed, storage: Path) -> None:
        super().__init__(daemon=True)
        self.bed, self.storage, self.seen = bed, storage, {}
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.02):
            for node in list(self.bed.nodes):
                root = node.private.get(self.storage)
                try:
                    paths = list(root.glob("runs/*/records.jsonl")) if root is not None else []
                except OSError:  # the node is being removed
                    continue
                for path in paths:
                    now = time.time()
                    try:
                        lines = path.read_text().splitlines()
                    except OSError:
                        continue
                    for line in lines:
                        try:
                            self.seen.setdefault((int(path.parent.name), int(json.loads(line)["step"])), now)
                        except (ValueError, KeyError):
                            continue  # a line being written


def one_sweep(runner: SweepRunner, database_url: str, night: int, watch: RecordWatch) -> dict[str, float]:
    with session_scope(database_url) as session:
        for schedule in session.scalars(select(Schedule)):  # an earlier night's schedule would fire too
            schedule.paused = True
        due_rented_night(session, f"rent-bench-{night}", ARMS, TINY)
    fired = time.time()
    runner.tick()
    with session_scope(database_url) as session:
        sweep = session.scalars(select(Sweep).order_by(Sweep.id.desc())).first()
        assert sweep is not None and sweep.state == SweepState.running, sweep and sweep.error
        sweep_id, grid_id = sweep.id, sweep.grid_id
    deadline = time.monotonic() + 900
    while True:
        assert time.monotonic() < deadline, "the sweep did not finish in 15 minutes"
        with session_scope(database_url) as session:
            if session.get_one(Sweep, sweep_id).state not in ACTIVE_SWEEP_STATES:
                break
        runner.tick()
        time.sleep(0.3)
    with session_scope(database_url) as session:
        sweep = session.get_one(Sweep, sweep_id)
        assert sweep.state == SweepState.completed, sweep.error
        assert len(session.get_one(Grid, grid_id).runs) == len(ARMS)
        in_grid = select(Metric.created_at).join(Run, Metric.run_id == Run.id).where(Run.grid_id == grid_id)
        first = session.scalar(in_grid.where(Metric.step == 1).order_by(Metric.created_at))
        last = session.scalar(
            select(func.max(Metric.created_at)).join(Run, Metric.run_id == Run.id).where(Run.grid_id == grid_id)
        )
        destroyed = session.scalar(
            select(func.max(RentedInstance.destroy_confirmed_at)).where(RentedInstance.sweep_id == sweep_id)
        )
        rows = session.execute(
            select(Metric.run_id, Metric.step, Metric.created_at).join(Run).where(Run.grid_id == grid_id)
        ).all()
    assert first is not None and last is not None and destroyed is not None
    lags = [_epoch(at) - watch.seen[(run, step)] for run, step, at in rows if (run, step) in watch.seen]
    assert len(lags) >= len(rows) // 2, f"records seen on the nodes: {len(lags)} of {len(rows)}"
    return {
        "fire_to_first_step_s": _epoch(first) - fired,
        "last_result_to_destroyed_s": _epoch(destroyed) - _epoch(last),
        "record_to_db_median_s": statistics.median(lags),
        "record_to_db_max_s": max(lags),
    }


def _epoch(at: datetime) -> float:
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()  # SQLite gives back naive UTC


def leaked_after_restart(bed: TestBed, sim: ProviderSim, database_url: str, storage: Path, work: Path) -> float:
    """Plant an instance of a sweep that is not under way; start a controller; seconds until it is gone."""
    provider = VastProvider(KEY, server_url=sim.url)
    request = NodeRequest.model_validate({**BED_REQUEST, "nodes": 1})
    offer = provider.search(request)[0]
    spec = LaunchSpec("ablate/worker:test", 20, "ssh-ed25519 AAAA leaked", InstanceLabel("bench", 9999))
    leaked = sim.instances[provider.create(offer, spec).instance_id]
    env = controller_env(bed, sim, KEY, "bench", work)
    log = work / "controller.log"
    with launcher_process(
        database_url, storage, log, "ablate-bench-rent", module="tests.cluster.rented_controller", **env
    ):
        started = time.time()
        deadline = time.monotonic() + 120
        while leaked.live:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
    return leaked.ended - started  # type: ignore[operator]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    offers = [vast_offer(900 + i, dph_total=1.2 + 0.01 * i) for i in range(2 * args.repeats + 1)]
    with bench_bed(nodes=0) as (bed, database_url, storage, work):
        hooks = bed_hooks(bed, gpus=lambda inst: 2)
        with ProviderSim(KEY, vast_offers=offers, hooks=hooks, host=bed.controller_ip) as sim:
            rental = bed_rental(bed.tag, work, controller_id="bench")
            runner = vast_runner(database_url, storage, bed, KEY, sim.url, rental)
            with launcher_process(database_url, storage, work / "launcher.log", "ablate-bench-rent"):
                watch = RecordWatch(bed, storage)
                watch.start()
                results = [one_sweep(runner, database_url, i, watch) for i in range(args.repeats)]
                watch.halt.set()
            assert sim.live() == [], "instances left after the sweeps"
            leak_s = leaked_after_restart(bed, sim, database_url, storage, work)
    lines = median_table(results, {
        "fire_to_first_step_s": "fire -> first optimizer step (renting 2 nodes included), s",
        "last_result_to_destroyed_s": "sweep's last result -> last destroy confirmed, s",
        "record_to_db_median_s": "a checkpoint's record on the node -> its metric row, median, s",
        "record_to_db_max_s": "a checkpoint's record on the node -> its metric row, max, s",
    })
    lines.append(f"\nleaked instance destroyed, seconds after a controller process started: {leak_s:.2f}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")

if __name__ == "__main__":
    main()
