"""An arm grows through the launcher: on a real local Ray (4 logical GPUs, tests/kit/launcher.py) and a real
database, a run of an auto grid ends early and the other, running on one GPU, grows onto the GPUs it
freed, resumes from the checkpoint its stop wrote on two ranks, and its series goes on."""

from __future__ import annotations

from orchestrator.db.session import session_scope
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.runs.launcher import Launcher
from tests.kit.polling import wait_for
from tests.kit.readers import all_ended, events_of, metrics_of, runs_of
from tests.kit.settings import tiny_overrides


def test_a_running_auto_arm_grows_from_one_gpu_to_two_when_another_ends_early(
    launcher: Launcher, database_url: str
) -> None:
    """P (`gpus: 3`, a batch of 6) and Q (the plan's to size, a batch of 2: one or two GPUs) are planned an
    hour each: Q on one GPU beside P makes the night 1 h, Q on two after P 1.5 h, so Q starts on one. P
    really trains 4 steps and ends at once: Q on two GPUs now ends the night about half an hour sooner,
    far more than the restart costs, so it grows at its next step."""
    with session_scope(database_url) as session:
        short = {"batch_size": 6, "steps": 4, "checkpoint_every": 4}
        arms = [{"parent": "A", "name": "P", "gpus": 3, "schedule": short}, {"parent": "A", "name": "Q"}]
        body = GridCreate(name="grow", arms=arms, overrides=tiny_overrides(300, 50, batch_size=2), gpus_per_arm="auto")
        grid = create_grid(session, body, nodes={"local": 4})
        # An hour each where they run (the scaling given: logical GPUs on a CPU do not scale).
        grid.plan = {**grid.plan, "hours": {"P": 3.0, "Q": 1.0}, "scaling": {"2": 2.0, "3": 3.0, "4": 4.0}}
        ids = [r.id for r in grid.runs]
    wait_for(lambda: all_ended(database_url, ids), "the grid to finish", timeout=400)
    p, q = runs_of(database_url, ids)
    assert [r.state for r in (p, q)] == ["completed"] * 2, [(r.state, r.error) for r in (p, q)]
    assert q.spec["gpus"] == 2 and len(q.gpu_index.split(",")) == 2 and q.retries == 1
    events = events_of(database_url, q.id)
    asked = next(e for e in events if e.kind == "grow_requested")
    grown = next(e for e in events if e.kind == "grown")
    assert (asked.data["from_gpus"], asked.data["to_gpus"]) == (1, 2)
    assert asked.data["grown_night_h"] < asked.data["night_h"]
    assert (grown.data["from_gpus"], grown.data["to_gpus"]) == (1, 2)
    at = grown.data["step"]
    assert 0 < at < 300
    resumed = next(e for e in events if e.kind == "resumed")
    assert resumed.data["step"] == at and resumed.id > grown.id
    # The series goes on: every checkpoint once, the stop's among them; one GPU before it, two after.
    metrics = metrics_of(database_url, q.id)
    assert [m.step for m in metrics] == sorted({*range(50, 301, 50), at})
    assert [m.extra["ranks"] for m in metrics] == [1 if m.step <= at else 2 for m in metrics]
