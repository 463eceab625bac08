"""The liveness judge replayed on reading sequences: the exact verdict of each reading."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from orchestrator.fleet.providers.base import Instance, InstanceLabel, InstanceState
from orchestrator.fleet.providers.liveness import Downtime, Verdict, judge

T0 = datetime(2026, 1, 1, 22, 0, tzinfo=UTC)
STATUS = {
    InstanceState.running: "running",
    InstanceState.unreachable: "offline",
    InstanceState.stopped: "exited",
    InstanceState.interrupted: "stopped",
    InstanceState.gone: "gone",
}


def _replay(readings: list[tuple[float, InstanceState]], interruptible: bool) -> list[Verdict]:
    """Each (seconds after T0, state) judged in order, the downtime carried as the runner carries it."""
    downtime: Downtime | None = None
    verdicts = []
    for at, state in readings:
        instance = Instance("vast", "7001", state, STATUS[state], InstanceLabel("night", 1), 1.2)
        judged = judge(instance, interruptible, downtime, T0 + timedelta(seconds=at))
        verdicts.append(judged.verdict)
        downtime = judged.downtime
    return verdicts


def test_a_one_minute_offline_blip_keeps_an_on_demand_node() -> None:
    blip = [(0, InstanceState.unreachable), (30, InstanceState.unreachable), (60, InstanceState.unreachable)]
    assert _replay([*blip, (90, InstanceState.running)], interruptible=False) == [
        Verdict.down,
        Verdict.down,
        Verdict.down,
        Verdict.up,
    ]


def test_an_on_demand_node_is_lost_after_five_readings_over_ten_minutes_not_before() -> None:
    offline = [(t, InstanceState.unreachable) for t in range(0, 601, 60)]  # 11 readings, 0..600 s
    assert _replay(offline, interruptible=False) == [Verdict.down] * 10 + [Verdict.lost]
    fast = [(t, InstanceState.stopped) for t in range(0, 51, 5)]  # many readings, under a minute
    assert _replay(fast, interruptible=False) == [Verdict.down] * 11


def test_an_interruptible_node_is_lost_after_three_readings_over_a_minute() -> None:
    stopped = [(0, InstanceState.stopped), (30, InstanceState.stopped), (60, InstanceState.stopped)]
    assert _replay(stopped, interruptible=True) == [Verdict.down, Verdict.down, Verdict.lost]
    # A recovery starts the count again.
    bumpy = [(0, InstanceState.stopped), (30, InstanceState.running), (60, InstanceState.stopped)]
    assert _replay([*bumpy, (90, InstanceState.stopped)], interruptible=True) == [
        Verdict.down,
        Verdict.up,
        Verdict.down,
        Verdict.down,
    ]


def test_what_the_provider_documents_decides_at_the_first_reading() -> None:
    for interruptible in (True, False):
        assert _replay([(0, InstanceState.interrupted)], interruptible) == [Verdict.preempted]
        assert _replay([(0, InstanceState.gone)], interruptible) == [Verdict.lost]
