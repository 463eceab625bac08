"""Whose values may stop an arm (runs/trust.py): the stall rule against the control stops an arm only on
values from the arm's own node or a trusted one; elsewhere it is a warning with the evidence. On a real
database, through ingest."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from orchestrator.db.models import Event, Node, Run
from orchestrator.db.session import session_scope
from orchestrator.fleet.inventory import LOCAL
from orchestrator.grids.service import GridCreate, create_grid
from orchestrator.runs.ingest import ingest
from orchestrator.vocabulary import RunState
from tests.kit.net import controller_env

OVERRIDES = {"schedule": {"steps": 100}, "detector": {"metric": "recon_lpips", "stall_margin": 0.1}}


def _node(name: str, trusted: bool) -> Node:
    return Node(name=name, host="203.0.113.9", user="u", key_path="/k", trusted=trusted, declared_gpus=1)


def _stall(database_url: str, control_node: str, arm_node: str, trusted: bool = False) -> tuple[Run, list[str]]:
    """The control's node reports an in-range lie far better than the honest arm; the arm's verdict and
    the warnings recorded on it."""
    with session_scope(database_url) as session:
        for node in {control_node, arm_node} - {LOCAL}:
            if session.scalar(select(Node).where(Node.name == node)) is None:
                session.add(_node(node, trusted=trusted and node == control_node))
        grid = create_grid(session, GridCreate(name="trust", arms=["A", "B"], overrides=OVERRIDES, control="A"))
        control, arm = grid.runs
        control.node, control.nodes, control.state = control_node, [control_node], RunState.running
        arm.node, arm.nodes, arm.state = arm_node, [arm_node], RunState.running
        ingest(session, control, [{"step": 90, "recon_lpips": 0.02}])  # the lie: within LPIPS' range
        ingest(session, arm, [{"step": 90, "recon_lpips": 0.5}])
        warnings = [
            w for e in session.scalars(select(Event).where(Event.run_id == arm.id, Event.kind == "warning"))
            for w in (e.data or {}).get("warnings", [])
        ]
        session.expunge(arm)
        return arm, warnings




def test_a_control_on_an_untrusted_node_never_stops_an_arm_on_another(database_url: str) -> None:
    arm, warnings = _stall(database_url, "rented-a", "rented-b")
    assert arm.decision is None and not arm.being_stopped, arm.decision_reason
    (warning,) = warnings
    # The evidence: the gap, the control's value and the node it came from.
    assert "stall not acted on" in warning and "0.0200" in warning and "rented-a" in warning, warning


@pytest.mark.parametrize(
    ("control_node", "arm_node", "trusted"),
    [("trusted-a", "rented-c", True), (LOCAL, "rented-d", False), ("rented-e", "rented-e", False)],
    ids=["trusted node", "controller's own machine", "the arm's own node"],
)
def test_a_control_on_a_trusted_or_the_arm_s_own_node_stops_a_stalled_arm(
    database_url: str, control_node: str, arm_node: str, trusted: bool
) -> None:
    arm, _ = _stall(database_url, control_node, arm_node, trusted)
    assert arm.decision == "stalled", arm.decision_reason


def test_the_operator_marks_a_node_trusted_through_the_api(database_url: str, tmp_path) -> None:  # noqa: ANN001
    """PATCH /api/nodes/{name} {"trusted": true}: from then on the control's node may stop other arms."""
    from fastapi.testclient import TestClient

    from orchestrator.app import create_app
    from orchestrator.settings import Settings

    arm, _ = _stall(database_url, "api-a", "api-b")
    assert arm.decision is None
    with TestClient(create_app(Settings(database_url=database_url, home_dir=tmp_path), "tok")) as client:
        auth = {"Authorization": "Bearer tok"}
        assert client.patch("/api/nodes/api-a", json={"trusted": True}).status_code == 401
        resp = client.patch("/api/nodes/api-a", json={"trusted": True, "gpus": 2}, headers=auth)
        assert resp.status_code == 200, resp.text
        assert (resp.json()["trusted"], resp.json()["declared_gpus"]) == (True, 2)
        bad = client.patch("/api/nodes/api-a", json={"gpus": 0}, headers=auth)
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][-1] == "gpus", bad.text
    with session_scope(database_url) as session:
        arm = session.get_one(Run, arm.id)
        ingest(session, arm, [{"step": 95, "recon_lpips": 0.5}])
        assert arm.decision == "stalled", arm.decision_reason


def test_a_grid_may_ask_for_its_control_on_a_trusted_node(database_url: str) -> None:
    from orchestrator.runs.trust import trusted_only

    free = {LOCAL: 1, "plain": 4, "vouched": 2}
    with session_scope(database_url) as session:
        session.add_all([_node("plain", trusted=False), _node("vouched", trusted=True)])
        grid = create_grid(session, GridCreate(name="placed", arms=["A", "B"], overrides=OVERRIDES, control="A",
                                               control_on_trusted=True))
        control, arm = grid.runs
        assert trusted_only(session, control, free) == {LOCAL: 1, "vouched": 2}
        assert trusted_only(session, arm, free) == free  # only the control is held to it
        grid.control_on_trusted = False
        assert trusted_only(session, control, free) == free


def test_the_operator_declares_gpus_and_trust_from_the_cli(
    database_url: str, tmp_path, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli import _register as register_commands
    from orchestrator.cli import app

    register_commands()
    key = tmp_path / "id_ed25519"
    key.write_text("k")
    runner = CliRunner()
    add = ["nodes", "add", "cli-trust", "--host", "203.0.113.5", "--user", "u", "--key", str(key)]
    with controller_env(database_url, tmp_path / "controller") as env:  # the commands ask a controller
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        missing = runner.invoke(app, add)
        assert missing.exit_code == 2 and "--gpus" in missing.output, missing.output
        assert runner.invoke(app, [*add, "--gpus", "4", "--trusted"]).exit_code == 0
        with session_scope(database_url) as session:
            node = session.scalar(select(Node).where(Node.name == "cli-trust"))
            assert (node.declared_gpus, node.trusted) == (4, True)
        changed = runner.invoke(app, ["nodes", "set", "cli-trust", "--gpus", "2", "--untrusted"])
        assert changed.exit_code == 0 and "2 GPUs declared, not trusted" in changed.output, changed.output
        with session_scope(database_url) as session:
            node = session.scalar(select(Node).where(Node.name == "cli-trust"))
            assert (node.declared_gpus, node.trusted) == (2, False)
        local = runner.invoke(app, ["nodes", "add", LOCAL, "--host", "h", "--user", "u", "--key", str(key),
                                    "--gpus", "1"])  # fmt: skip
    assert local.exit_code != 0 and "controller's own machine" in local.output + str(local.exception)
