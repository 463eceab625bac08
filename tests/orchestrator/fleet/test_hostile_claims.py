"""A node whose agent keeps the protocol and lies in its claims: the controller checks each claim against
what it knows itself, or bounds it, and a lie moves nothing outside the liar's own runs.

The liar is tests/orchestrator/fleet/hostile_agent.py, driven by the real launcher: over pipes (the same
AgentLink the controller uses over a node's SSH channel) for what a reply claims, and as a joined node's
`agent` over the loopback OpenSSH server for what its hello claims (which workers it holds, how many GPUs).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, func, select, update

from orchestrator.db.models import Event, Metric, Node, RentedInstance, Run
from orchestrator.db.session import session_scope
from orchestrator.fleet.node_pool import POLL_GRACE_S
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.runs.ingest import MAX_FALLBACKS
from orchestrator.runs.launcher import Launcher
from orchestrator.runs.placement import record_placement
from orchestrator.settings import Settings
from tests.kit.polling import wait_for
from tests.kit.readers import run_of
from tests.kit.settings import tiny_overrides
from worker.protocol import STORAGE_LOG_MAX
from worker.run_files import RECORDS_PER_POLL

AGENT = Path(__file__).with_name("hostile_agent.py")

# mode, its argument, and what the failed run's error must say was refused
REFUSED: dict[str, tuple[str, str]] = {
    "lpips-lie": ("", "recon_lpips -1e+300 is outside its range [0, 2]"),
    "negative-loss": ("", "train_loss -3 is outside its range [0, inf]"),
    "step-cap": ("", "a record with step 1099511627776 (expected an integer after -1, at most 2147483647)"),
    "flood": (str(RECORDS_PER_POLL), f"records: List should have at most {RECORDS_PER_POLL} items"),
    "fallbacks": (str(MAX_FALLBACKS + 1), f"fallbacks are not a list of at most {MAX_FALLBACKS} strings"),
    "forged-started": ("", "storage.log.0.kind: Input should be 'checkpoint.stored'"),
    "forged-rented.replacement": ("", "storage.log.0.kind: Input should be 'checkpoint.stored'"),
    "storage-flood": (str(STORAGE_LOG_MAX + 1), f"storage.log: List should have at most {STORAGE_LOG_MAX} items"),
    "storage-data": ("", "storage.log.0.data.node_name: Extra inputs are not permitted"),
    "label": ("", "cmmd_extractor '<img src=x onerror=\"alert(1)\">![p](https'... (1000075 characters): not a label"),
    "deep": ("", "not JSON (nested deeper than 32"),
    "bigint": ("", "not JSON (Exceeds the limit (4300 digits)"),
}


def _settings(database_url: str, tmp_path: Path, **changes: Any) -> Settings:
    return Settings(
        database_url=database_url, home_dir=tmp_path / "storage", launcher_interval_s=0.2, max_retries=0,
        **changes,
    )  # fmt: skip


def _grid(database_url: str, name: str, arms: list[str]) -> list[int]:
    with session_scope(database_url) as session:
        grid = create_grid(session, GridCreate(name=name, arms=arms, overrides=tiny_overrides(steps=4)))
        return [run.id for run in grid.runs]



def _kinds(database_url: str, run_id: int) -> list[str]:
    with session_scope(database_url) as session:
        return list(session.scalars(select(Event.kind).where(Event.run_id == run_id)))


@pytest.mark.parametrize("mode", list(REFUSED))
def test_a_claim_out_of_bounds_is_refused_with_the_reason_and_nothing_of_it_is_stored(
    mode: str, database_url: str, tmp_path: Path
) -> None:
    arg, reason = REFUSED[mode]
    (run_id,) = _grid(database_url, f"claims-{mode}", ["A"])
    launcher = Launcher(_settings(database_url, tmp_path), local_agent=[sys.executable, str(AGENT), mode, arg])
    launcher.start()
    try:
        wait_for(lambda: run_of(database_url, run_id).state == "failed", f"the {mode} node's run to fail", 60)
        assert launcher._thread is not None and launcher._thread.is_alive()  # the controller serves on
    finally:
        assert launcher.stop()
    run = run_of(database_url, run_id)
    assert reason in (run.error or ""), run.error
    kinds = _kinds(database_url, run_id)
    assert not {"checkpoint", "started", "rented.replacement"} & set(kinds), kinds
    assert not any(k.startswith("checkpoint.") for k in kinds), kinds
    with session_scope(database_url) as session:
        assert session.scalar(select(func.count()).select_from(Metric).where(Metric.run_id == run_id)) == 0


def test_a_silent_node_holds_each_pass_up_briefly_and_is_refused_after_node_lost_s(
    database_url: str, tmp_path: Path
) -> None:
    """A node that answers hello and start but never a poll: no pass waits past the poll's grace, and
    once its polls have gone unanswered for node_lost_s it is refused and its run counted lost."""
    (run_id,) = _grid(database_url, "silent", ["A"])
    settings = _settings(database_url, tmp_path, node_lost_s=4.0)
    launcher = Launcher(settings, local_agent=[sys.executable, str(AGENT), "silent"])
    passes, started = [], time.monotonic()
    try:
        while run_of(database_url, run_id).state != "failed":
            assert time.monotonic() - started < 60, "the silent node's run was never counted lost"
            t0 = time.monotonic()
            launcher.tick()
            passes.append(time.monotonic() - t0)
    finally:
        launcher.pool.close()
    assert max(passes) < settings.launcher_interval_s + POLL_GRACE_S + 2, passes
    run = run_of(database_url, run_id)
    assert "no poll reply for" in run.error and "node_lost_s=4" in run.error, run.error


def test_a_control_arm_s_refused_value_never_stops_another_arm(database_url: str) -> None:
    """A control arm's stored series holds a value outside its range (left by a node before this check
    existed): the stall comparison ignores it, so an honest arm is not stopped as stalled."""
    from orchestrator.runs.ingest import ingest, insert_metrics

    overrides = {**tiny_overrides(steps=100), "detector": {"metric": "recon_lpips", "stall_margin": 0.1}}
    with session_scope(database_url) as session:
        grid = create_grid(session, GridCreate(name="lie", arms=["A", "B"], overrides=overrides, control="A"))
        control, arm = grid.runs
        insert_metrics(session, control.id, [{"step": 90, "recon_lpips": -1e300}])  # bypasses the ingest check
        steps = ingest(session, arm, [{"step": 90, "recon_lpips": 0.4}])
        assert steps == [90]
        assert arm.decision is None and not arm.being_stopped, arm.decision_reason
        # The same control, with an honest value far better: the check itself still stops a stalled arm.
        insert_metrics(session, control.id, [{"step": 80, "recon_lpips": 0.1}])
        ingest(session, arm, [{"step": 95, "recon_lpips": 0.4}])
        assert arm.decision == "stalled", arm.decision_reason
        control.state = arm.state = "stopped"  # never launched: the module's later launchers leave them be


# -- over SSH: what a joined node's hello claims ------------------------------------------------------------


def _forget(database_url: str, node: str, runs: list[int]) -> None:
    """The module shares its database: the node leaves, and its test's runs leave the queue."""
    with session_scope(database_url) as session:
        session.execute(delete(Node).where(Node.name == node))
        session.execute(update(Run).where(Run.id.in_(runs)).values(state="stopped"))


def _joined_liar(database_url: str, sshd: Any, monkeypatch: pytest.MonkeyPatch, node: str, *argv: str) -> str:  # noqa: ANN401
    """A joined node, probed (the stand-in nvidia-smi's 4 GPUs), whose `agent` is the liar in `argv`."""
    from orchestrator.fleet.probe import probe_node
    from tests.kit.nodes import add_ssh_node

    remote = sshd.workdir / node
    remote.mkdir(exist_ok=True)  # the server serves the whole module
    (remote / "agent").write_text(f"#!/bin/sh\nexec {sys.executable} {AGENT} {' '.join(argv)}\n")
    (remote / "agent").chmod(0o700)
    monkeypatch.setenv("ABLATE_NODE_REMOTE_DIR", sshd.relative(remote))
    name = add_ssh_node(database_url, sshd, node)
    probe_node(database_url, name)
    with session_scope(database_url) as session:
        session.scalars(select(Node).where(Node.name == name)).one().state = "joined"
    return name


def test_a_node_naming_a_worker_it_was_never_given_is_refused_and_takes_no_run(
    database_url: str, sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    """The liar names the worker of a run placed on it (adopted) and that of the control arm, queued and
    placed nowhere (predictable: ablate-run-<id>-0). The hello is refused with that name; the control
    is never started there."""
    control, placed = _grid(database_url, "foreign", ["A", "B"])  # the first arm is the control
    with session_scope(database_url) as session:  # a controller placed `placed` there, then died
        run = session.get_one(Run, placed)
        run.state = "starting"
        record_placement(session, run, "liar-foreign", f"ablate-run-{placed}-0")
    names = f"ablate-run-{placed}-0,ablate-run-{control}-0"
    name = _joined_liar(database_url, sshd, monkeypatch, "liar-foreign", "foreign", names)
    launcher = Launcher(_settings(database_url, tmp_path, local_node=False))
    launcher.start()
    try:
        def refused() -> bool:
            with session_scope(database_url) as session:
                return session.scalars(select(Node.state).where(Node.name == name)).one() == "bootstrap_failed"

        wait_for(refused, "the node naming a worker it was never given to be refused", 60)
        with session_scope(database_url) as session:
            detail = session.scalars(select(Node.state_detail).where(Node.name == name)).one()
    finally:
        assert launcher.stop()
        _forget(database_url, name, [control, placed])
    assert f"never given: ablate-run-{control}-0" in detail and f"ablate-run-{placed}-0" not in detail, detail
    assert run_of(database_url, control).state == "stopped" and "placed" not in _kinds(database_url, control)


def test_a_node_that_names_only_its_own_workers_has_them_adopted(
    database_url: str, sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    (placed,) = _grid(database_url, "own", ["B"])
    with session_scope(database_url) as session:
        run = session.get_one(Run, placed)
        run.state = "starting"
        record_placement(session, run, "liar-own", f"ablate-run-{placed}-0")
    name = _joined_liar(database_url, sshd, monkeypatch, "liar-own", "foreign", f"ablate-run-{placed}-0")
    launcher = Launcher(_settings(database_url, tmp_path, local_node=False))
    launcher.start()
    try:
        wait_for(lambda: run_of(database_url, placed).state == "running", "the placed worker to be adopted", 60)
    finally:
        assert launcher.stop()
        _forget(database_url, name, [placed])
    assert run_of(database_url, placed).nodes == [name]


@pytest.mark.parametrize("rented", [None, 2])
def test_a_node_s_gpu_claim_is_capped_by_what_the_probe_or_the_rental_found(
    rented: int | None, database_url: str, sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    """hello claims 1024 GPUs; the probe found 4 (a rented node: the rental's count). Six queued runs:
    only as many as the controller found start there."""
    name = _joined_liar(database_url, sshd, monkeypatch, f"liar-gpus-{rented}", "gpus", "1024")
    if rented is not None:
        with session_scope(database_url) as session:
            session.add(RentedInstance(provider="sim", instance_id="i-1", gpus=rented, label="l", node_name=name))
    expected = rented if rented is not None else 4
    runs = _grid(database_url, "gpus", ["A", "B", "C", "D", "E", "F"])
    launcher = Launcher(_settings(database_url, tmp_path, local_node=False))

    def placed() -> int:
        return sum(run_of(database_url, r).state != "queued" for r in runs)

    launcher.start()
    try:
        wait_for(lambda: placed() >= expected, f"{expected} runs to start on the node", 60)
        time.sleep(2)  # ten more passes: no further run goes there
        assert placed() == expected
    finally:
        assert launcher.stop()
        _forget(database_url, name, runs)
