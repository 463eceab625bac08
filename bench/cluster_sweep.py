"""Overnight sweep latencies on the namespace test bed (tests/cluster/testbed.py), as root on Linux.

Measures, on two firewalled namespace nodes, each running its own Ray, reached over real SSH, with the real
launcher in its own process:
  - node provisioned -> started: the node's own Ray head (`agent start-head`, SSH command duration);
  - fire -> first optimizer step on a node: the sweep's fire tick to the first metric row at step 1
    (checkpoint_every=1, so the first record follows the first optimizer step; includes the step-1
    evaluation of 2 tiny samples and the launcher's 0.3 s poll);
  - teardown: each node's leave (stop its Ray session) + cleanup commands, and the whole collecting
    tick (copy-back of every run's checkpoints + teardown of both nodes).

    python bench/cluster_sweep.py [--repeats 1] [--out docs/bench-results/cluster_sweep.md]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import func, select  # noqa: E402

from orchestrator.db.models import Event, Grid, Metric, Run, Schedule, Sweep  # noqa: E402
from orchestrator.db.session import session_scope, upgrade  # noqa: E402
from orchestrator.sweeps.runner import SweepRunner  # noqa: E402
from orchestrator.sweeps.schedules import ScheduleCreate, create_schedule  # noqa: E402
from orchestrator.vocabulary import ACTIVE_SWEEP_STATES, SweepState  # noqa: E402
from tests.cluster.testbed import TestBed  # noqa: E402
from tests.kit.bed import launcher_process, node_config, register_node, worker_bed  # noqa: E402
from tests.kit.clock import FakeClock  # noqa: E402
from tests.kit.settings import tiny_overrides  # noqa: E402

TINY = tiny_overrides(5, checkpoint_every=1, batch_size=2, num_images=32, warmup_steps=1)
ARMS = ["A", "B", "C", {"parent": "A", "name": "A2"}, {"parent": "A", "name": "A3"}]


def one_sweep(bed: TestBed, database_url: str, storage: Path, night: int) -> dict[str, float]:
    fire_at = datetime(2026, 4, 1 + night, 22, tzinfo=UTC)
    with session_scope(database_url) as session:
        for schedule in session.scalars(select(Schedule)):  # an earlier night's schedule would fire too
            schedule.paused = True
        create_schedule(
            session,
            ScheduleCreate(
                name=f"bench-{night}",
                cron="0 22 * * *",
                grid={"name": f"bench-{night}", "arms": ARMS, "overrides": TINY},
                nodes=[n.name for n in bed.nodes],
            ),
            now=fire_at - timedelta(hours=1),
        )
    clock = FakeClock(fire_at)  # the fire's time, then real time
    clock.follow_real_time()
    runner = SweepRunner(database_url, storage, clock=clock, node_config=node_config(bed))
    with session_scope(database_url) as session:
        before = session.scalar(select(func.max(Event.id))) or 0
    fired = time.time()
    runner.tick()
    with session_scope(database_url) as session:
        sweep = session.scalars(select(Sweep).order_by(Sweep.id.desc())).first()
        assert sweep is not None and sweep.state == SweepState.running, sweep and sweep.error
        sweep_id, grid_id = sweep.id, sweep.grid_id
        joins = [
            e.data["duration_s"]
            for e in session.scalars(select(Event).where(Event.kind == "node.command", Event.id > before))
            if "start-head" in e.message
        ]
    first_step = None
    collect_s = None
    deadline = time.monotonic() + 900
    while True:
        assert time.monotonic() < deadline, "the sweep did not finish in 15 minutes"
        if first_step is None:
            with session_scope(database_url) as session:
                first = session.scalar(
                    select(Metric.created_at)
                    .join(Run, Metric.run_id == Run.id)
                    .where(Run.grid_id == grid_id, Metric.step == 1)
                    .order_by(Metric.created_at)
                )
            if first is not None:
                first_step = first.replace(tzinfo=UTC).timestamp() - fired
        with session_scope(database_url) as session:
            state = session.get_one(Sweep, sweep_id).state
        if state not in ACTIVE_SWEEP_STATES:
            break
        started = time.monotonic()
        runner.tick()
        with session_scope(database_url) as session:
            if session.get_one(Sweep, sweep_id).state not in ACTIVE_SWEEP_STATES:
                collect_s = time.monotonic() - started  # the tick that copied back and tore down
        time.sleep(0.3)
    with session_scope(database_url) as session:
        sweep = session.get_one(Sweep, sweep_id)
        assert sweep.state == SweepState.completed, sweep.error
        assert len(session.get_one(Grid, grid_id).runs) == 5
        leaves = [
            e.data["duration_s"]
            for e in session.scalars(select(Event).where(Event.kind == "node.command", Event.id > before))
            if "stop-session" in e.message or e.message.startswith("rm -rf")
        ]
    return {
        "join_s": max(joins),
        "fire_to_first_step_s": first_step or float("nan"),
        "teardown_commands_s": sum(leaves) / len(bed.nodes),
        "collecting_tick_s": collect_s or float("nan"),
    }


@contextlib.contextmanager
def bench_bed(nodes: int) -> Iterator[tuple[TestBed, str, Path, Path]]:
    """A namespace test bed of `nodes` firewalled nodes (2 logical GPUs each) with this checkout's packages and
    a SQLite database: (bed, database_url, storage, work). work is removed afterwards."""
    work = Path(tempfile.mkdtemp(prefix="ablate-bench-"))
    database_url = f"sqlite:///{work / 'ablate.db'}"
    upgrade(database_url)
    with worker_bed(nodes) as bed:
        yield bed, database_url, bed.storage, work  # type: ignore[attr-defined]
    shutil.rmtree(work, ignore_errors=True)


def median_table(results: list[dict[str, float]], labels: dict[str, str]) -> list[str]:
    """One row per measurement (labels: key -> row label), one column per sweep, then the median."""
    lines = [
        "| measurement | " + " | ".join(f"sweep {i + 1}" for i in range(len(results))) + " | median |",
        "|---|" + "---|" * (len(results) + 1),
    ]
    for key, label in labels.items():
        values = [r[key] for r in results]
        lines.append(f"| {label} | " + " | ".join(f"{v:.2f}" for v in values) + f" | {statistics.median(values):.2f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with bench_bed(nodes=2) as (bed, database_url, storage, work):
        with launcher_process(database_url, storage, work / "launcher.log", "ablate-bench"):
            for node in bed.nodes:
                register_node(database_url, node, price_per_hour=1.0)
            results = [one_sweep(bed, database_url, storage, i) for i in range(args.repeats)]
    text = "\n".join(median_table(results, {
        "join_s": "node provisioned -> its Ray started (`agent start-head`, slowest node), s",
        "fire_to_first_step_s": "fire -> first optimizer step on a node, s",
        "teardown_commands_s": "teardown per node (leave + cleanup commands), s",
        "collecting_tick_s": "copy-back + teardown of both nodes (the sweep's last tick), s",
    }))
    print(text)
    if args.out:
        args.out.write_text(text + "\n")

if __name__ == "__main__":
    main()
