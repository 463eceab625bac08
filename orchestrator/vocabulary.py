"""The words the orchestrator stores and shows: run, grid, sweep and node states, and the decisions
on a run. Every module, the dashboard's script included (`for_script`), takes them from here.

StrEnums, so a member is the very string stored in the database column (no migration) and compares
equal to it when a row is read back as plain text.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class RunState(StrEnum):
    """queued -> starting -> running -> completed | stopped | failed (who moves each: docs/architecture.md)."""

    queued = "queued"
    starting = "starting"
    running = "running"
    completed = "completed"
    stopped = "stopped"
    failed = "failed"


TERMINAL_STATES = frozenset({RunState.completed, RunState.stopped, RunState.failed})
# A worker of ours holds a GPU for the run (the launcher polls it, a restart adopts it).
ACTIVE_STATES = frozenset({RunState.starting, RunState.running})


class DecisionKind(StrEnum):
    """The collapse detector's verdict on a checkpoint (orchestrator.runs.detector.decide)."""

    CONTINUE = "continue"
    COLLAPSE = "collapse"
    DIVERGED = "diverged"
    STALLED = "stalled"


class RunDecision(StrEnum):
    """What `Run.decision` holds: the detector's verdict, the user's stop, or a flag in warn mode."""

    CONTINUE = DecisionKind.CONTINUE.value
    COLLAPSE = DecisionKind.COLLAPSE.value
    DIVERGED = DecisionKind.DIVERGED.value
    STALLED = DecisionKind.STALLED.value
    USER = "user"  # stopped by the user while queued
    # Detector policy mode `warn`: flagged once, the run goes on.
    WARN_COLLAPSE = f"warn:{DecisionKind.COLLAPSE}"
    WARN_DIVERGED = f"warn:{DecisionKind.DIVERGED}"
    WARN_STALLED = f"warn:{DecisionKind.STALLED}"

    @classmethod
    def warning(cls, kind: DecisionKind) -> RunDecision:
        return cls(f"warn:{kind}")


# The decisions that stop a run (and keep a stopped run from ever being launched again).
DETECTOR_STOPS = frozenset({RunDecision.COLLAPSE, RunDecision.DIVERGED, RunDecision.STALLED})
STOP_DECISIONS = DETECTOR_STOPS | {RunDecision.USER}


class TrackerName(StrEnum):
    """An experiment tracker the controller forwards a grid's runs to (orchestrator/trackers/)."""

    wandb = "wandb"
    tensorboard = "tensorboard"
    mlflow = "mlflow"


class GridSource(StrEnum):
    """Where a grid came from."""

    submitted = "submitted"  # REST or `ablate submit`
    imported = "imported"  # published curves (`ablate import`): finished, never launched
    schedule = "schedule"  # fired by a schedule's sweep


class GridState(StrEnum):
    """One word for a grid on the dashboard, from its runs' states."""

    empty = "empty"
    queued = "queued"
    running = "running"
    failed = "failed"
    finished = "finished"


# The dashboard polls while a grid is in one of these.
LIVE_GRID_STATES = frozenset({GridState.queued, GridState.running})


class EvaluationState(StrEnum):
    """An evaluation of a grid's stored checkpoints, and each run's job in it: queued -> running ->
    completed | failed (orchestrator/runs/evaluation_jobs.py); a job also -> skipped (a diverged run's)."""

    queued = "queued"
    running = "running"
    completed = "completed"
    failed = "failed"
    skipped = "skipped"  # a job whose run the detector stopped as diverged and whose checkpoint measures non-finite


class SweepState(StrEnum):
    """provisioning -> running -> (stopping) -> collecting -> completed | stopped | failed."""

    provisioning = "provisioning"
    running = "running"
    stopping = "stopping"
    collecting = "collecting"
    completed = "completed"
    stopped = "stopped"
    failed = "failed"


# A sweep under way: the runner advances it, its schedule cannot fire again or be deleted.
ACTIVE_SWEEP_STATES = frozenset(
    {SweepState.provisioning, SweepState.running, SweepState.stopping, SweepState.collecting}
)


LOCAL_NODE = "local"  # the controller's own machine, as a node name
# A run's event: re-queued to resume on more GPUs (runs/grow.py); a new attempt, not a retry. Here, not in
# runs/, because the planner (grids/projection.py) reads it too.
GROWN = "grown"


class NodeState(StrEnum):
    """registered -> ready (probed, environment installed) -> joined (its own Ray and agent running) -> drained."""

    registered = "registered"
    ready = "ready"
    joined = "joined"
    drained = "drained"
    # A sweep's teardown failed after its retries: the node may still be running and billing.
    teardown_failed = "teardown_failed"
    # Its last bootstrap failed (state_detail says at which step and how); the next bootstrap clears it.
    bootstrap_failed = "bootstrap_failed"


class RentedState(StrEnum):
    """An instance a sweep rented, as the controller tracks it: renting -> running -> destroyed, or
    destroy_failed (red: it may still bill; the reaper retries by its label) or failed (never usable,
    destroyed) or preempted (taken back by the provider mid-sweep, then destroyed; see
    orchestrator/sweeps/preemption.py)."""

    renting = "renting"  # create sent, waiting until SSH answers
    running = "running"  # reachable, host key pinned, a node of the sweep
    destroyed = "destroyed"  # the provider confirmed it gone: it bills no more
    failed = "failed"  # not reachable / bootstrap failed: destroyed and replaced by another offer
    destroy_failed = "destroy_failed"  # destroy not confirmed: may still be billing
    preempted = "preempted"  # the provider took it back mid-sweep (interruptible): destroyed, confirmed


# The provider may still bill for these.
BILLING_RENTED_STATES = frozenset({RentedState.renting, RentedState.running, RentedState.destroy_failed})


def for_script() -> dict[str, Any]:
    """The vocabulary the dashboard's scripts use, rendered into each page as JSON (#vocabulary)."""
    return {
        "run_state": {m.name: m.value for m in RunState},
        "decision": {m.name.lower(): m.value for m in RunDecision},
        "node_state": {m.name: m.value for m in NodeState},
        "rented_state": {m.name: m.value for m in RentedState},
        "live_grid_states": sorted(LIVE_GRID_STATES),
        "terminal_run_states": sorted(TERMINAL_STATES),
    }
