"""An arm grows through the launcher: on a real local Ray (4 logical GPUs, tests/kit/launcher.py) and a real
database, a run of an auto grid ends early and the other, running on one GPU, grows onto the GPUs it
freed, resumes from the checkpoint its stop wrote on two ranks, and its series goes on."""

from __future__ import annotations

from orchestrator.db.models import Run
from orchestrator.db.session import session_scope
from orchestrator.grids.service import GridCreate, create_grid, stop_run
from orchestrator.runs.launcher import Launcher
from tests.kit.polling import wait_for
from tests.kit.readers import all_ended, events_of, metrics_of, runs_of
from tests.kit.settings import tiny_overrides

EVERY = 20  # Q's checkpoint interval


def test_a_running_auto_arm_grows_from_one_gpu_to_two_when_another_ends_early(
    launcher: Launcher, database_url: str
) -> None:
    """P (`gpus: 3`, a batch of 6) and Q (the plan's to size, a batch of 2: one or two GPUs) take an hour
    each where they run: Q on one GPU beside P makes the night 1 h, Q on two after P 1.5 h, so Q starts on
    one. P really trains 4 steps and ends at once: Q on two GPUs now ends the night about half an hour
    sooner, far more than the restart costs, so it grows at its next step. Q never ends by itself (the
    test stops it once it trained on two ranks), so nothing here races P's end against Q's."""
    with session_scope(database_url) as session:
        short = {"batch_size": 6, "steps": 4, "checkpoint_every": 4}
        arms = [{"parent": "A", "name": "P", "gpus": 3, "schedule": short}, {"parent": "A", "name": "Q"}]
        overrides = tiny_overrides(100_000, EVERY, batch_size=2)
        grid = create_grid(session, GridCreate(name="grow", arms=arms, overrides=overrides, gpus_per_arm="auto"),
                           nodes={"local": 4})
        # An hour each where they run (the scaling given: logical GPUs on a CPU do not scale).
        grid.plan = {**grid.plan, "hours": {"P": 3.0, "Q": 1.0}, "scaling": {"2": 2.0, "3": 3.0, "4": 4.0}}
        ids = [r.id for r in grid.runs]
    p_id, q_id = ids

    def trained_on_two() -> bool:
        return any(m.extra.get("ranks") == 2 for m in metrics_of(database_url, q_id))

    wait_for(trained_on_two, "Q grown onto P's GPUs and a checkpoint on two ranks", timeout=300)
    with session_scope(database_url) as session:
        stop_run(session, session.get(Run, q_id))
    wait_for(lambda: all_ended(database_url, ids), "the grid to end", timeout=120)
    p, q = runs_of(database_url, ids)
    assert (p.state, q.state) == ("completed", "stopped"), [(r.state, r.error) for r in (p, q)]
    assert q.spec["gpus"] == 2 and len(q.gpu_index.split(",")) == 2 and q.retries == 1
    events = events_of(database_url, q_id)
    asked = next(e for e in events if e.kind == "grow_requested")
    grown = next(e for e in events if e.kind == "grown")
    assert (asked.data["from_gpus"], asked.data["to_gpus"]) == (1, 2)
    assert asked.data["grown_night_h"] < asked.data["night_h"]
    assert (grown.data["from_gpus"], grown.data["to_gpus"]) == (1, 2)
    assert asked.id < grown.id < next(e for e in events if e.kind == "resumed").id
    at = grown.data["step"]
    assert next(e for e in events if e.kind == "resumed").data["step"] == at
    # The series goes on: every checkpoint once, the growth's stop and the user's among them; one GPU
    # up to the growth, two after it.
    metrics = metrics_of(database_url, q_id)
    last = metrics[-1].step
    assert [m.step for m in metrics] == sorted({*range(EVERY, last + 1, EVERY), at, last})
    assert [m.extra["ranks"] for m in metrics] == [1 if m.step <= at else 2 for m in metrics]
