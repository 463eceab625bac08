"""A real OpenSSH server on loopback for the node and sweep tests; a module's settings and API client.

Temp host key, a generated client key in a temp authorized_keys, an unprivileged free port, run as
the current user. The only stand-in is an `nvidia-smi` script first on the server's PATH (set by the
authorized key's environment= option, PermitUserEnvironment yes).
"""

from __future__ import annotations

import getpass
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.kit.net import controller_env, controller_for

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

    from orchestrator.settings import Settings

SSHD = Path("/usr/sbin/sshd")

# What `nvidia-smi --query-gpu=index,name,memory.total,driver_version,uuid --format=csv,noheader,nounits`
# prints on a rented quad RTX 4090 node.
GPU_ROWS = [
    "0, NVIDIA GeForce RTX 4090, 24564, 550.54.14, GPU-0a1b2c3d-0000-4000-8000-000000000000",
    "1, NVIDIA GeForce RTX 4090, 24564, 550.54.14, GPU-0a1b2c3d-0000-4000-8000-000000000001",
    "2, NVIDIA GeForce RTX 4090, 24564, 550.54.14, GPU-0a1b2c3d-0000-4000-8000-000000000002",
    "3, NVIDIA GeForce RTX 4090, 24564, 550.54.14, GPU-0a1b2c3d-0000-4000-8000-000000000003",
]


@dataclass
class SshServer:
    host: str
    port: int
    user: str
    client_key: Path
    known_hosts: Path
    host_key_pub: Path
    workdir: Path  # a scratch directory on the "remote" side, below the login (home) directory

    def relative(self, path: Path) -> str:
        """`path` (under workdir) as the login-relative remote_dir that BootstrapConfig requires."""
        return path.relative_to(self.home).as_posix()

    @property
    def home(self) -> Path:
        return Path(pwd.getpwuid(os.getuid()).pw_dir)


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    if not SSHD.exists():
        pytest.skip("/usr/sbin/sshd is absent: install Debian's openssh-server to run the SSH node tests")
    d = tmp_path_factory.mktemp("sshd")
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory, as the Debian unit makes
    _keygen(d / "host_ed25519")
    _keygen(d / "client_ed25519")
    bindir = d / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'if [ "$*" != "--query-gpu=index,name,memory.total,driver_version,uuid --format=csv,noheader,nounits" ]; then\n'
        '  echo "stand-in nvidia-smi: unexpected arguments: $*" >&2; exit 2\nfi\n'
        "cat <<'EOF'\n" + "\n".join(GPU_ROWS) + "\nEOF\n"
    )
    smi.chmod(0o755)
    path = f"{bindir}:{os.environ.get('PATH', '/usr/local/bin:/usr/bin:/bin')}"
    pub = (d / "client_ed25519.pub").read_text().strip()
    (d / "authorized_keys").write_text(f'environment="PATH={path}" {pub}\n')
    from tests.kit.net import free_port  # project modules only once a fixture runs

    port = free_port()
    user = getpass.getuser()
    cfg = d / "sshd_config"
    cfg.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_ed25519'}\nPidFile {d / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nAllowUsers {user}\n"
        "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "UsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\nPermitUserEnvironment yes\n"
        "Subsystem sftp internal-sftp\nLogLevel VERBOSE\n"
    )
    log = (d / "sshd.log").open("w")
    proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(cfg)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                pytest.fail(f"sshd exited {proc.returncode}: {(d / 'sshd.log').read_text()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"sshd did not listen on {port}: {(d / 'sshd.log').read_text()}")
                time.sleep(0.1)
        # Trust the server the way docs/operations.md tells users to: ssh-keyscan into a known-hosts file.
        scan = subprocess.run(
            ["ssh-keyscan", "-t", "ed25519", "-p", str(port), "127.0.0.1"], capture_output=True, text=True, check=True
        )
        (d / "known_hosts").write_text(scan.stdout)
        # remote_dir must be relative to the login directory (teardown deletes it): a scratch dir there.
        work = Path(pwd.getpwuid(os.getuid()).pw_dir) / f".ablate-test-remote-{port}-{os.getpid()}"
        work.mkdir()
        yield SshServer(
            host="127.0.0.1",
            port=port,
            user=user,
            client_key=d / "client_ed25519",
            known_hosts=d / "known_hosts",
            host_key_pub=d / "host_ed25519.pub",
            workdir=work,
        )
    finally:
        shutil.rmtree(Path(pwd.getpwuid(os.getuid()).pw_dir) / f".ablate-test-remote-{port}-{os.getpid()}", True)
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


AblateCLI = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="session")
def ablate_cli() -> AblateCLI:
    """Run the installed `ablate` command against a database: `ablate_cli(database_url, "import", ...)`; a
    command that reads a controller reads one served on that database."""
    exe = shutil.which("ablate") or str(Path(sys.executable).parent / "ablate")

    def run(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "ABLATE_DATABASE_URL": database_url}
        with tempfile.TemporaryDirectory() as home, controller_for(args, env, Path(home)) as controller:
            return subprocess.run([exe, *args], env={**env, **controller}, capture_output=True, text=True,
                                  timeout=120)

    return run


@pytest.fixture
def cli_controller(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A controller served on `database_url`, named in this process's ABLATE_URL and ABLATE_API_TOKEN, so a
    command run in-process (typer's CliRunner) asks it; its URL."""
    with controller_env(database_url, tmp_path / "controller") as env:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        yield env["ABLATE_URL"]


@pytest.fixture(scope="module")
def settings(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """A migrated database's settings for a test module (a module's own fixture of the same name wins)."""
    from orchestrator.settings import Settings

    return Settings(database_url=database_url, home_dir=tmp_path_factory.mktemp("storage"))


@pytest.fixture(scope="module")
def client(settings: Settings) -> Iterator[TestClient]:
    """The API on `settings`, authenticated by tests.kit.settings.API_TOKEN."""
    from fastapi.testclient import TestClient

    from orchestrator.app import create_app
    from tests.kit.settings import API_TOKEN

    with TestClient(create_app(settings, API_TOKEN)) as c:
        yield c
