"""Copy-back against a hostile node: a real SSH/SFTP server (paramiko's) whose listings lie.

OpenSSH never lists `../x` or `/etc/x`, so a node that does was changed by someone; the controller
must write nothing outside the sweep's results directory, whatever names it is sent.
"""

from __future__ import annotations

import io
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from orchestrator.fleet.errors import NodeError
from orchestrator.fleet.safe_fetch import fetch_tree
from orchestrator.fleet.shell import NodeShell

FILES = {"ok.txt": b"fine", "sub/inner.txt": b"also fine"}
HOSTILE = ["../escape.txt", "/tmp/abs-escape.txt", "..", ".", "a/../../up.txt", "nul\x00.txt"]
ENDLESS = 3 << 20  # /big/big.bin: listed as 1 byte, served as 3 MiB


class _Sftp(paramiko.SFTPServerInterface):
    """Serves FILES under /ckpt, and lists HOSTILE names beside them; any file read returns b"pwned"."""

    def _attrs(self, name: str, is_dir: bool, size: int = 0) -> paramiko.SFTPAttributes:
        a = paramiko.SFTPAttributes()
        a.filename, a.st_size = name, size
        a.st_mode = (stat.S_IFDIR | 0o755) if is_dir else (stat.S_IFREG | 0o644)
        a.st_uid = a.st_gid = 0
        a.st_atime = a.st_mtime = 0
        return a

    def _rel(self, path: str) -> str:
        return path.removeprefix("/ckpt").strip("/")

    def list_folder(self, path: str) -> list[paramiko.SFTPAttributes]:
        if path == "/big":
            return [self._attrs("big.bin", False, 1)]
        rel = self._rel(path)
        if rel == "":
            return [self._attrs("ok.txt", False, 4), self._attrs("sub", True)] + [
                self._attrs(n, False, 5) for n in HOSTILE
            ]
        if rel == "sub":
            return [self._attrs("inner.txt", False, 9)]
        return paramiko.SFTP_NO_SUCH_FILE

    def lstat(self, path: str) -> paramiko.SFTPAttributes:
        if path.startswith("/big"):
            return self._attrs(path.rsplit("/", 1)[-1], path == "/big", 1)
        rel = self._rel(path)
        return self._attrs(rel.rsplit("/", 1)[-1], rel in ("", "sub"), len(FILES.get(rel, b"pwned")))

    stat = lstat

    def open(self, path: str, flags: int, attr: paramiko.SFTPAttributes) -> paramiko.SFTPHandle:
        handle = paramiko.SFTPHandle(flags)
        data = b"x" * ENDLESS if path == "/big/big.bin" else FILES.get(self._rel(path), b"pwned")
        handle.readfile = io.BytesIO(data)  # type: ignore[attr-defined]
        return handle


class _Server(paramiko.ServerInterface):
    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED


class _Row:
    def __init__(self, port: int, key: Path, known_hosts: Path) -> None:
        self.id, self.name, self.host, self.port, self.user = None, "hostile", "127.0.0.1", port, "x"
        self.key_path, self.known_hosts_path = str(key), str(known_hosts)


@pytest.fixture()
def hostile_node(tmp_path: Path) -> Iterator[_Row]:
    host_key = paramiko.Ed25519Key.from_private_key_file(_keygen(tmp_path / "host"))
    client_key = _keygen(tmp_path / "client")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    (tmp_path / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}\n")
    transports: list[paramiko.Transport] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            t = paramiko.Transport(conn)
            t.add_server_key(host_key)
            t.set_subsystem_handler("sftp", paramiko.SFTPServer, _Sftp)
            t.start_server(server=_Server())
            transports.append(t)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield _Row(port, client_key, tmp_path / "known_hosts")
    listener.close()
    for t in transports:
        t.close()


def _keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def test_copy_back_writes_nothing_outside_the_results_dir(hostile_node: _Row, tmp_path: Path) -> None:
    results = tmp_path / "results" / "sweeps" / "1"
    results.mkdir(parents=True)
    before = set(tmp_path.rglob("*")) | set(Path("/tmp").glob("abs-escape*"))
    skipped: list[str] = []
    with NodeShell.open(hostile_node) as shell:  # type: ignore[arg-type]
        written = fetch_tree(shell, "/ckpt", results / "run", skipped)
    assert sorted(p.relative_to(results / "run").as_posix() for p in written) == ["ok.txt", "sub/inner.txt"]
    assert (results / "run" / "ok.txt").read_bytes() == b"fine"
    after = set(tmp_path.rglob("*")) | set(Path("/tmp").glob("abs-escape*"))
    assert {p for p in after - before if not p.is_relative_to(results / "run")} == set()
    # paramiko's client drops "." and ".." itself; every other hostile name is refused and reported.
    assert sorted(skipped) == sorted(f"/ckpt/{n!r} (unsafe name)" for n in HOSTILE if n not in (".", ".."))


def test_copy_back_stops_at_its_cap_whatever_size_the_node_lists(hostile_node: _Row, tmp_path: Path) -> None:
    local = tmp_path / "results" / "run"
    with NodeShell.open(hostile_node) as shell, pytest.raises(NodeError, match="over its cap"):  # type: ignore[arg-type]
        fetch_tree(shell, "/big", local, max_bytes=1 << 20)
    assert sum(p.stat().st_size for p in local.rglob("*") if p.is_file()) == 0, "the partial file is removed"


@pytest.mark.parametrize("name", ["../../../../tmp/pwned", "/abs", "a b", ".hidden", "x\\y"])
def test_arm_names_that_are_not_one_safe_path_part_get_a_422(database_url: str, tmp_path: Path, name: str) -> None:
    from fastapi.testclient import TestClient

    from orchestrator.app import create_app
    from orchestrator.settings import Settings

    client = TestClient(create_app(Settings(database_url=database_url, home_dir=tmp_path), "t"))
    body = {"name": "g", "arms": ["A", {"parent": "A", "name": name}]}
    r = client.post("/api/grids", json=body, headers={"Authorization": "Bearer t"})
    assert r.status_code == 422
    [error] = r.json()["detail"]
    assert error["loc"] == ["body", "arms", 1, "name"]
    assert "only letters, digits" in error["msg"]
