"""Nodes against a real OpenSSH server on loopback (see conftest.py): probe, bootstrap, host keys, CLI."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.db.models import Event, Node
from orchestrator.db.session import session_scope
from orchestrator.fleet.bootstrap import BootstrapConfig, bootstrap_node, run_steps, teardown_node
from orchestrator.fleet.errors import HostKeyError
from orchestrator.fleet.inventory import get_node
from orchestrator.fleet.probe import probe_node
from orchestrator.fleet.safe_fetch import fetch_tree
from orchestrator.fleet.shell import CommandFailed, NodeShell
from tests.kit.net import controller_env
from tests.kit.nodes import add_ssh_node


def _ssh_keygen_fingerprint(pub: Path) -> str:
    # `ssh-keygen -lf` prints "256 SHA256:... comment (ED25519)": the reference our message must match.
    return subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True).stdout.split()[1]


def _register(database_url: str, sshd, name: str, known_hosts: Path | None = None) -> None:  # noqa: ANN001
    add_ssh_node(database_url, sshd, name, price_per_hour=2.4, known_hosts=known_hosts)


def _node(database_url: str, name: str) -> Node:
    with session_scope(database_url) as session:
        node = get_node(session, name)
        session.expunge(node)
    return node


def _tiny_wheel(directory: Path) -> Path:
    """A real, minimal wheel (stands where the project's wheel goes) so the venv + pip install steps run for real."""
    files = {
        "ablate_probe_pkg/__init__.py": b"MARK = 'installed on the node'\n",
        "ablate_probe_pkg-0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: ablate-probe-pkg\nVersion: 0.1\n",
        "ablate_probe_pkg-0.1.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("ablate_probe_pkg-0.1.dist-info/RECORD,,")
    path = directory / "ablate_probe_pkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr("ablate_probe_pkg-0.1.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def test_probe_reports_gpus_disk_python_and_records_each_command(database_url: str, sshd) -> None:  # noqa: ANN001
    _register(database_url, sshd, "quad-a")
    result = probe_node(database_url, "quad-a")

    assert [g["index"] for g in result["gpus"]] == [0, 1, 2, 3]
    assert result["gpus"][0] == {
        "index": 0,
        "name": "NVIDIA GeForce RTX 4090",
        "memory_mib": 24564,
        "driver": "550.54.14",
        "uuid": "GPU-0a1b2c3d-0000-4000-8000-000000000000",
    }
    assert result["free_disk_gb"] > 0
    assert re.fullmatch(r"3\.\d+\.\d+", result["python"])
    json.dumps(result)  # the probe is JSON as-is

    with session_scope(database_url) as session:
        node = get_node(session, "quad-a")
        assert node.state == "ready" and len(node.gpus) == 4
        events = session.scalars(select(Event).where(Event.node_id == node.id, Event.kind == "node.command")).all()
    smi = [e for e in events if e.message.startswith("nvidia-smi")]
    assert smi and smi[0].data["exit_code"] == 0 and "RTX 4090" in smi[0].data["stdout"]
    assert any(e.message.startswith("df -Pk") for e in events)


def test_failing_step_stops_the_sequence_with_command_and_output(database_url: str, sshd) -> None:  # noqa: ANN001
    _register(database_url, sshd, "quad-fail")
    marker = sshd.workdir / "after-failure"
    with NodeShell.open(_node(database_url, "quad-fail"), database_url) as shell:
        with pytest.raises(CommandFailed) as info:
            run_steps(shell, ["true", "echo disk full >&2; exit 3", f"touch {marker}"], {}, timeout_s=30)
        assert "exit 3" in str(info.value) and "exited 3" in str(info.value) and "disk full" in str(info.value)
        assert not marker.exists()  # the step after the failure never ran

        with pytest.raises(CommandFailed, match="timed out after 0.5 s"):
            shell.run("sleep 20", timeout_s=0.5)
    with session_scope(database_url) as session:
        node_id = get_node(session, "quad-fail").id
        rows = session.scalars(select(Event).where(Event.node_id == node_id).order_by(Event.id)).all()
    assert [(e.data["exit_code"], e.data["timed_out"]) for e in rows] == [(0, False), (3, False), (None, True)]
    assert "disk full" in rows[1].data["stderr"]


def test_bootstrap_installs_venv_and_starts_then_teardown_removes(database_url: str, sshd, tmp_path: Path) -> None:  # noqa: ANN001
    _register(database_url, sshd, "quad-boot")
    remote = sshd.workdir / "boot"
    config = BootstrapConfig(
        python=sys.executable,  # the interpreter of this test run: same Python minor version as the "controller"
        package=_tiny_wheel(tmp_path),
        remote_dir=sshd.relative(remote),
        install=[
            "{python} -m venv {venv}",
            "{venv}/bin/pip install --no-index --no-deps {package}",
            "{venv}/bin/python -c 'import ablate_probe_pkg; print(ablate_probe_pkg.MARK)'",
        ],
        # A node's Ray head on the test machine itself would be one more Ray here: a recorded start instead
        # (tests/cluster starts real ones in namespaces).
        start=["echo {num_gpus} > {remote_dir}/started"],
        env={"ABLATE_PROBE": "a b"},
        leave=["rm -f {remote_dir}/started"],
        command_timeout_s=300,
    )
    found = bootstrap_node(database_url, "quad-boot", config)
    assert len(found["gpus"]) == 4
    assert (remote / "ablate_probe_pkg-0.1-py3-none-any.whl").is_file()  # copied over SFTP
    assert (remote / "venv" / "bin" / "python").exists()
    assert (remote / "started").read_text().split() == ["4"]
    launcher = remote / "agent"  # what the controller runs over SSH to reach the node's agent
    assert stat.S_IMODE(launcher.stat().st_mode) == 0o700
    text = launcher.read_text().replace(config.remote_dir + "/", "")
    assert "ABLATE_PROBE='a b' venv/bin/python -m worker.agent" in text
    with session_scope(database_url) as session:
        node = get_node(session, "quad-boot")
        assert node.state == "joined"
        assert node.last_probe["probed_at"] == found["probed_at"]  # bootstrap probes: `nodes list` says when
        commands = select(Event).where(Event.node_id == node.id, Event.kind == "node.command")
        outputs = [e.data["stdout"] for e in session.scalars(commands)]
    assert any("installed on the node" in o for o in outputs)

    teardown_node(database_url, "quad-boot", config)
    assert not remote.exists()
    assert _node(database_url, "quad-boot").state == "registered"


def test_failed_bootstrap_marks_the_node_until_the_next_one(database_url: str, sshd, monkeypatch,  # noqa: ANN001
                                                            tmp_path: Path) -> None:
    """A start that exits 126 leaves the node `bootstrap_failed (start: exit 126)`, through the teardown that
    follows, in `ablate nodes list` too; the next bootstrap that succeeds clears it."""
    from orchestrator.cli import _register as register_commands

    _register(database_url, sshd, "quad-broken")
    remote = sshd.relative(sshd.workdir / "broken")
    failing = BootstrapConfig(
        remote_dir=remote, install=["true"], start=["sh -c 'exit 126'"], leave=["true"], cleanup=["true"],
    )
    with pytest.raises(CommandFailed, match="exited 126"):
        bootstrap_node(database_url, "quad-broken", failing)
    node = _node(database_url, "quad-broken")
    assert (node.state, node.state_detail) == ("bootstrap_failed", "start: exit 126")
    teardown_node(database_url, "quad-broken", failing)
    assert _node(database_url, "quad-broken").state == "bootstrap_failed", "teardown must not hide the failure"

    register_commands()
    monkeypatch.setenv("ABLATE_DATABASE_URL", database_url)
    with controller_env(database_url, tmp_path / "controller") as env:  # `nodes list` reads a controller
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        listed = CliRunner().invoke(app, ["nodes", "list"])
    assert listed.exit_code == 0 and "bootstrap_failed (start: exit 126)" in listed.output, listed.output

    fixed = failing.model_copy(update={"start": ["true"]})
    bootstrap_node(database_url, "quad-broken", fixed)
    node = _node(database_url, "quad-broken")
    assert (node.state, node.state_detail) == ("joined", None)


def test_bootstrap_without_the_package_it_installs_is_refused_before_any_command(database_url: str, sshd) -> None:  # noqa: ANN001
    _register(database_url, sshd, "quad-nopkg")
    from orchestrator.fleet.errors import NodeError

    with pytest.raises(NodeError, match="ABLATE_NODE_PACKAGE"):
        bootstrap_node(database_url, "quad-nopkg", BootstrapConfig(package=None))
    with session_scope(database_url) as session:
        node_id = get_node(session, "quad-nopkg").id
        ran = session.scalars(select(Event).where(Event.node_id == node_id, Event.kind == "node.command")).all()
    assert ran and not any("mkdir" in e.message or "pip" in e.message for e in ran)  # the probe's, none of bootstrap's


def test_changed_host_key_is_refused_with_fingerprint(database_url: str, sshd, tmp_path: Path) -> None:  # noqa: ANN001
    # A known-hosts file that records a different key for this host:port (a re-imaged node, or an attacker).
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kind, blob = (other.with_suffix(".pub")).read_text().split()[:2]
    stale = tmp_path / "known_hosts"
    stale.write_text(f"[{sshd.host}]:{sshd.port} {kind} {blob}\n")
    _register(database_url, sshd, "quad-changed", known_hosts=stale)

    with pytest.raises(HostKeyError) as info:
        probe_node(database_url, "quad-changed")
    message = str(info.value)
    assert "CHANGED" in message
    assert _ssh_keygen_fingerprint(sshd.host_key_pub) in message  # what the server offered
    assert _ssh_keygen_fingerprint(other.with_suffix(".pub")) in message  # what was recorded
    assert f"ssh-keyscan -p {sshd.port} {sshd.host}" in message
    assert _node(database_url, "quad-changed").state == "registered"


def test_unknown_host_key_is_refused_with_fingerprint_and_how_to_trust(database_url: str, sshd, tmp_path: Path) -> None:  # noqa: ANN001
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    _register(database_url, sshd, "quad-unknown", known_hosts=empty)
    with pytest.raises(HostKeyError) as info:
        probe_node(database_url, "quad-unknown")
    message = str(info.value)
    assert "unknown host key" in message and _ssh_keygen_fingerprint(sshd.host_key_pub) in message
    assert f"ssh-keyscan -p {sshd.port} {sshd.host} >> {empty}" in message and f"--known-hosts {empty}" in message


def test_fetch_tree_copies_a_remote_directory(database_url: str, sshd, tmp_path: Path) -> None:  # noqa: ANN001
    _register(database_url, sshd, "quad-fetch")
    src = sshd.workdir / "ckpt"
    (src / "step_100").mkdir(parents=True)
    (src / "step_100" / "model.pt").write_bytes(b"\x00weights")
    (src / "metrics.jsonl").write_text('{"step": 100}\n')
    with NodeShell.open(_node(database_url, "quad-fetch"), database_url) as shell:
        written = fetch_tree(shell, str(src), tmp_path / "back")
    assert sorted(p.relative_to(tmp_path / "back").as_posix() for p in written) == [
        "metrics.jsonl",
        "step_100/model.pt",
    ]
    assert (tmp_path / "back" / "step_100" / "model.pt").read_bytes() == b"\x00weights"


def test_fetch_tree_skips_symbolic_links(database_url: str, sshd, tmp_path: Path) -> None:  # noqa: ANN001
    _register(database_url, sshd, "quad-links")
    src = sshd.workdir / "linked"
    (src / "step_1").mkdir(parents=True)
    (src / "step_1" / "model.pt").write_bytes(b"w")
    (src / "root").symlink_to("/")  # followed, this would copy the node's whole filesystem
    (src / "step_1" / "alias.pt").symlink_to(src / "step_1" / "model.pt")
    skipped: list[str] = []
    with NodeShell.open(_node(database_url, "quad-links"), database_url) as shell:
        written = fetch_tree(shell, str(src), tmp_path / "back", skipped)
    assert [p.relative_to(tmp_path / "back").as_posix() for p in written] == ["step_1/model.pt"]
    assert sorted(p.relative_to(tmp_path / "back").as_posix() for p in (tmp_path / "back").rglob("*")) == [
        "step_1",
        "step_1/model.pt",
    ]
    assert sorted(skipped) == [str(src / "root"), str(src / "step_1" / "alias.pt")]
    with session_scope(database_url) as session:
        node_id = get_node(session, "quad-links").id
        notes = session.scalars(select(Event.message).where(Event.node_id == node_id, Event.kind == "node.sftp.get"))
        assert any("skipped 2 symbolic links" in m and str(src / "root") in m for m in notes)


@pytest.mark.parametrize(
    "remote_dir", ["ablate/..", "./", "~/.", "/home/u", "", " ", ".", "~", "/", "..", "a/../b", "$HOME", "~/ablate"]
)
def test_remote_dir_that_teardown_would_delete_wrongly_is_refused(remote_dir: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="remote_dir"):
        BootstrapConfig(remote_dir=remote_dir)


def test_remote_dir_is_normalised_and_quoted() -> None:
    assert BootstrapConfig(remote_dir="./ablate/").remote_dir == "ablate"
    assert BootstrapConfig(remote_dir="runs/./night").remote_dir == "runs/night"
    variables = BootstrapConfig(remote_dir="my runs", python="/opt/py 3/bin/python3").variables(1)
    assert variables["remote_dir"] == "'my runs'" and variables["python"] == "'/opt/py 3/bin/python3'"


def test_cli_add_list_probe_remove(database_url: str, sshd, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
                                   tmp_path: Path) -> None:
    from orchestrator.cli import _register as register_commands

    register_commands()
    runner = CliRunner()
    args = ["nodes", "add", "cli-node", "--host", sshd.host, "--port", str(sshd.port), "--user", sshd.user]
    args += ["--key", str(sshd.client_key), "--known-hosts", str(sshd.known_hosts), "--price-per-hour", "3.2"]
    args += ["--gpus", "4"]
    with controller_env(database_url, tmp_path / "controller") as env:  # every `nodes` command asks a controller
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        listed = runner.invoke(app, ["nodes", "list"])
        assert listed.exit_code == 0 and "cli-node" in listed.output and "3.2" in listed.output
        probed = runner.invoke(app, ["nodes", "probe", "cli-node"])
        assert probed.exit_code == 0, probed.output
        assert len(json.loads(probed.output)["gpus"]) == 4

        bad = runner.invoke(app, ["nodes", "add", "x", "--host", "h", "--user", "u", "--key", "/nonexistent/key",
                                  "--gpus", "1"])
        assert bad.exit_code != 0 and "key_path" in str(bad.exception) + bad.output

        removed = runner.invoke(app, ["nodes", "remove", "cli-node"])
        assert removed.exit_code == 0
        with session_scope(database_url) as session:
            assert session.scalar(select(Node).where(Node.name == "cli-node")) is None
        gone = runner.invoke(app, ["nodes", "probe", "cli-node"])
    assert gone.exit_code != 0 and "cli-node" in str(gone.exception), gone.output


def test_nodes_over_rest(database_url: str, sshd, tmp_path: Path) -> None:  # noqa: ANN001
    from fastapi.testclient import TestClient

    from orchestrator.app import create_app
    from orchestrator.settings import Settings

    settings = Settings(database_url=database_url, ssh_key_dirs=[sshd.client_key.parent, tmp_path])
    client = TestClient(create_app(settings, "tok"))
    auth = {"Authorization": "Bearer tok"}
    body = {
        "name": "rest-node",
        "host": sshd.host,
        "port": sshd.port,
        "user": sshd.user,
        "key_path": str(sshd.client_key),
        "known_hosts_path": str(sshd.known_hosts),
        "price_per_hour": 1.5,
        "gpus": 4,
    }
    assert client.post("/api/nodes", json=body).status_code == 401
    missing = client.post("/api/nodes", json={**body, "key_path": str(sshd.client_key) + ".gone"}, headers=auth)
    assert missing.status_code == 422 and missing.json()["detail"][0]["loc"] == ["body", "key_path"]
    # Outside ABLATE_SSH_KEY_DIRS: refused alike whether or not the file exists (no existence oracle).
    outside = [
        client.post("/api/nodes", json={**body, "key_path": p}, headers=auth) for p in ("/etc/shadow", "/no/key")
    ]
    assert [r.status_code for r in outside] == [422, 422]
    assert outside[0].json()["detail"] == outside[1].json()["detail"]
    assert "ABLATE_SSH_KEY_DIRS" in outside[0].json()["detail"][0]["msg"]
    assert client.get("/api/nodes").status_code == 401  # hosts, users and key paths need the token
    assert client.get("/api/nodes/rest-node").status_code == 401
    created = client.post("/api/nodes", json=body, headers=auth)
    assert created.status_code == 201, created.text
    assert client.post("/api/nodes", json=body, headers=auth).status_code == 409

    probed = client.post("/api/nodes/rest-node/probe", headers=auth)
    assert probed.status_code == 200, probed.text
    assert [g["memory_mib"] for g in probed.json()["gpus"]] == [24564] * 4
    assert client.get("/api/nodes/rest-node", headers=auth).json()["state"] == "ready"

    empty = tmp_path / "known_hosts"
    empty.write_text("")
    client.post("/api/nodes", json={**body, "name": "rest-unknown", "known_hosts_path": str(empty)}, headers=auth)
    refused = client.post("/api/nodes/rest-unknown/probe", headers=auth)
    assert refused.status_code == 424 and "SHA256:" in refused.json()["detail"]

    assert client.post("/api/nodes/nope/probe", headers=auth).status_code == 404
    assert client.delete("/api/nodes/rest-node", headers=auth).status_code == 204
    assert client.get("/api/nodes/rest-node", headers=auth).status_code == 404


def test_a_command_s_output_is_held_bounded_whatever_the_node_prints(database_url: str, sshd) -> None:  # noqa: ANN001
    import tracemalloc

    from orchestrator.fleet.shell import OUTPUT_MAX_BYTES

    _register(database_url, sshd, "quad-loud")
    printed = 24 << 20
    with NodeShell.open(_node(database_url, "quad-loud"), database_url) as shell:
        tracemalloc.start()
        result = shell.run(f"head -c {printed - 3} /dev/zero | tr '\\0' x; printf END; head -c 1000 /dev/zero >&2")
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert result.ok and result.stdout.endswith("xEND") and len(result.stdout) == OUTPUT_MAX_BYTES
    assert result.dropped_bytes == printed - OUTPUT_MAX_BYTES and len(result.stderr) == 1000
    assert peak < 8 * OUTPUT_MAX_BYTES, f"held {peak / 2**20:.0f} MiB for {printed >> 20} MiB printed"
