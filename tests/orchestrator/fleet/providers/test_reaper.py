"""The reaper's choice: this controller's labelled instances that no live sweep owns, nothing else."""

from __future__ import annotations

from orchestrator.fleet.providers.base import Instance, InstanceLabel, InstanceState
from orchestrator.fleet.providers.reaper import to_reap


def _instance(iid: str, label: InstanceLabel | None, state: InstanceState = InstanceState.running) -> Instance:
    return Instance("vast", iid, state, state.value, label, 1.6, gpus=4)


def test_only_our_instances_of_dead_sweeps_are_reaped() -> None:
    instances = [
        _instance("1", InstanceLabel("night", 7)),  # live sweep: kept
        _instance("2", InstanceLabel("night", 8)),  # dead sweep: reaped
        _instance("3", InstanceLabel("day", 8)),  # another controller's: never touched
        _instance("4", None),  # not rented by ablate
        _instance("5", InstanceLabel("night", 9), InstanceState.stopped),  # stopped still bills disk: reaped
        _instance("6", InstanceLabel("night", 10), InstanceState.pending),  # mid-create of a dead sweep: reaped
        _instance("7", InstanceLabel("night", 11), InstanceState.gone),  # already gone
    ]
    reaped = to_reap(instances, "night", live_sweeps={7})
    assert [r.instance.instance_id for r in reaped] == ["2", "5", "6"]
    assert reaped[0].reason == "sweep 8 is not live (vast running)"


def test_after_a_restart_with_no_live_sweep_everything_of_ours_goes() -> None:
    instances = [_instance(str(i), InstanceLabel("night", i)) for i in range(3)]
    assert len(to_reap(instances, "night", live_sweeps=[])) == 3
    assert to_reap(instances, "night", live_sweeps=[0, 1, 2]) == []
