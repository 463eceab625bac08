"""A test bed of "rented nodes" on one Linux machine: network namespaces on one bridge.

Each node is a network namespace with its own veth on a bridge in the root namespace (where the
controller runs, at the bridge's address), its own IP, its own Linux user with its own home
directory, and its own OpenSSH server (own host key) that listens only on the node's IP. The
only stand-in is `nvidia-smi`, which prints the node's declared logical GPUs. Paths that
must be node-local (the controller's storage dir, which workers on a real node create on their own
disk) are bind-mounted over with a per-node directory inside the node's mount namespace.

Everything is named after the creating process id (bridge, namespaces, veths, users, subnet), so
two test beds on one machine never collide, and everything is removed by `close()`: processes of
the node users by pid, the sshds by process group, namespaces, links, users, files.

With `firewall=True` each node's namespace is firewalled (nftables) as a provider's NAT leaves a rented
container: inbound, only SSH and replies to the node's own connections; outbound, no new connection to
the controller's address (but the ports `allow_to_controller` opens: storage, the provider's API, which
stand for services on the internet) or to any other node.

Usable from pytest (tests/cluster/conftest.py) and from bench/ scripts:

    with TestBed(nodes=2, gpus=2) as bed:
        bed.nodes[0].ip, bed.controller_ip, bed.nodes[0].client_key, ...
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

SSHD = Path("/usr/sbin/sshd")
GPU_QUERY_ARGS = "--query-gpu=index,name,memory.total,driver_version,uuid --format=csv,noheader,nounits"


def stand_in_nvidia_smi(path: Path, gpus: int, node_index: int = 0) -> Path:
    """The test bed's only stand-in: an `nvidia-smi` that answers the probe's query with `gpus` logical GPUs."""
    rows = "\n".join(
        f"{g}, NVIDIA GeForce RTX 4090, 24564, 550.54.14, GPU-{node_index:08x}-0000-4000-8000-{g:012x}"
        for g in range(gpus)
    )
    path.write_text(
        "#!/bin/sh\n"
        f'if [ "$*" != "{GPU_QUERY_ARGS}" ]; then\n'
        '  echo "stand-in nvidia-smi: unexpected arguments: $*" >&2; exit 2\nfi\n'
        f"cat <<'EOF'\n{rows}\nEOF\n"
    )
    path.chmod(0o755)
    return path


class TestBedUnavailable(RuntimeError):
    """This machine cannot host the test bed (not root, no `ip netns`, no sshd); the reason says which."""


@dataclass
class BedNode:
    name: str
    ip: str
    netns: str
    user: str
    home: Path
    client_key: Path  # the controller's key for this node's login user
    known_hosts: Path  # this node's host key, as `ssh-keyscan` reports it
    gpus: int
    port: int = 22
    sshd: subprocess.Popen[bytes] | None = None
    private: dict[Path, Path] = field(default_factory=dict)  # controller path -> this node's own copy
    # A container node's (add_container_node): what ends it. Its user is the container's root, whose
    # processes are never looked up by uid here (that would be this machine's root).
    stop: Callable[[], None] | None = None

    @property
    def uid(self) -> int:
        return pwd.getpwnam(self.user).pw_uid


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` exited {result.returncode}: {result.stderr.strip()}")
    return result


def _subnet_in_use(prefix: str) -> bool:
    return f" {prefix}." in _run("ip", "-4", "-o", "addr").stdout or _run("ip", "-4", "route").stdout.startswith(prefix)


def _pids_of_uid(uid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    pids.append(int(entry.name))
            except FileNotFoundError:
                pass
    return pids


def kill_uid(uid: int, grace_s: float = 5.0) -> None:
    """SIGTERM every process of `uid` (a user that exists only for the test bed), SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _pids_of_uid(uid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while _pids_of_uid(uid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _pids_of_uid(uid):
            return


class TestBed:
    """N namespace nodes with sshd; `start()` builds them, `close()` removes everything (idempotent).

    `private_paths`: controller paths that each node sees as its own empty directory (owned by
    its user), as a rented node's disk would be. `readable`: controller paths the node users must
    reach (a pre-built Python environment): where one lies below a directory closed to other users
    (a Python under /root), the node sees that directory as an empty tmpfs holding only those paths.
    """

    __test__ = False  # not a pytest class

    def __init__(
        self,
        nodes: int = 2,
        gpus: int | list[int] = 2,
        private_paths: list[Path] | None = None,
        readable: list[Path] | None = None,
        tag: str | None = None,
        firewall: bool = False,
    ) -> None:
        self.tag = tag or f"ab{os.getpid() % 100000}"
        self.count = nodes
        self.gpus = gpus if isinstance(gpus, list) else [gpus] * nodes
        self.private_paths = [Path(p) for p in private_paths or []]
        self.readable = [Path(p).resolve() for p in readable or []]
        self.root = Path("/tmp") / self.tag  # short: Ray's unix sockets live under the nodes' homes
        self.firewall = firewall
        self.controller_ports: list[int] = []  # what a firewalled node may still reach on the controller
        self.bridge = f"{self.tag}br"
        self.prefix = ""
        self.controller_ip = ""
        self.nodes: list[BedNode] = []
        self._created: list[tuple[str, str]] = []  # (kind, name), undone in reverse order

    # -- build ---------------------------------------------------------------------------------------

    def __enter__(self) -> TestBed:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def check() -> None:
        """TestBedUnavailable unless this machine can create namespaces and run sshd."""
        if os.geteuid() != 0:
            raise TestBedUnavailable("the cluster test bed needs root (network namespaces, users, sshd)")
        for tool in ("ip", "useradd", "userdel", "ssh-keygen", "ssh-keyscan", "unshare", "nft"):
            if shutil.which(tool) is None:
                raise TestBedUnavailable(
                    f"`{tool}` is missing (Debian: iproute2, passwd, openssh-client, util-linux, nftables)"
                )
        if not SSHD.exists():
            raise TestBedUnavailable("/usr/sbin/sshd is missing (Debian: openssh-server)")
        probe = f"abprobe{os.getpid() % 100000}"
        made = _run("ip", "netns", "add", probe, check=False)
        if made.returncode != 0:
            raise TestBedUnavailable(f"cannot create a network namespace here: {made.stderr.strip()}")
        _run("ip", "netns", "del", probe, check=False)

    def start(self) -> None:
        self.check()
        pid = os.getpid()
        for bump in range(64):
            prefix = f"10.{150 + (pid + bump) % 100}.{(pid // 100) % 256}"
            if not _subnet_in_use(prefix):
                break
        else:
            raise TestBedUnavailable("no free 10.x.y.0/24 subnet for the test bed")
        self.prefix, self.controller_ip = prefix, f"{prefix}.1"
        self.root.mkdir(mode=0o755)
        self._created.append(("dir", str(self.root)))
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self._created.append(("link", self.bridge))
        _run("ip", "addr", "add", f"{self.controller_ip}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for i in range(self.count):
            self.nodes.append(self._add_node(i))
        for node in self.nodes:
            self._wait_ssh(node)

    def _namespace(self, i: int) -> tuple[str, str, Path]:
        """Node i's network namespace with its veth on the bridge, address and firewall; (netns, ip, dir)."""
        ns, veth, ip = f"{self.tag}n{i}", f"{self.tag}v{i}", f"{self.prefix}.{11 + i}"
        d = self.root / f"n{i}"
        d.mkdir(mode=0o755)
        _run("ip", "netns", "add", ns)
        self._created.append(("netns", ns))
        _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        self._created.append(("link", veth))
        _run("ip", "link", "set", veth, "master", self.bridge, "up")
        _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        _run("ip", "-n", ns, "link", "set", "eth0", "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        if self.firewall:
            self._firewall(ns)
        return ns, ip, d

    def _add_node(self, i: int) -> BedNode:
        name, user = f"node{i}", f"{self.tag}u{i}"
        ns, ip, d = self._namespace(i)

        # Its own login user and home; password '*' (no password, but not "locked": sshd without PAM
        # refuses a locked account even for a key).
        home = d / "h"
        _run(
            "useradd", "--home-dir", str(home), "--create-home", "--shell", "/bin/bash", "--user-group", "-p", "*", user
        )
        self._created.append(("user", user))
        uid = pwd.getpwnam(user).pw_uid
        gid = pwd.getpwnam(user).pw_gid

        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key")], check=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "client_key")], check=True)
        bindir = d / "bin"
        bindir.mkdir(mode=0o755)
        stand_in_nvidia_smi(bindir / "nvidia-smi", self.gpus[i], node_index=i)
        path = f"{bindir}:/usr/local/bin:/usr/bin:/bin"
        pub = (d / "client_key.pub").read_text().strip()
        (d / "authorized_keys").write_text(f'environment="PATH={path}" {pub}\n')
        (d / "authorized_keys").chmod(0o644)
        cfg = d / "sshd_config"
        cfg.write_text(
            f"ListenAddress {ip}\nPort 22\nHostKey {d / 'host_key'}\nPidFile {d / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {d / 'authorized_keys'}\nAllowUsers {user}\n"
            "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "UsePAM no\nStrictModes no\nPermitUserEnvironment yes\nSubsystem sftp internal-sftp\n"
            "LogLevel VERBOSE\n"
        )
        # Node-local directories over controller paths, visible only in this node's mount namespace.
        private: dict[Path, Path] = {}
        mounts = []
        for k, target in enumerate(self.private_paths):
            own = d / f"private{k}"
            own.mkdir(mode=0o755)
            os.chown(own, uid, gid)
            target.mkdir(parents=True, exist_ok=True)
            private[target] = own
            mounts.append(f"mount --bind {own} {target} && ")
        mounts += self._expose(d)
        log = (d / "sshd.log").open("wb")
        sshd = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                ns,
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                "".join(mounts) + f"exec {SSHD} -D -e -f {cfg}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: close() ends exactly it
        )
        log.close()
        node = BedNode(
            name=name,
            ip=ip,
            netns=ns,
            user=user,
            home=home,
            client_key=d / "client_key",
            known_hosts=d / "known_hosts",
            gpus=self.gpus[i],
            sshd=sshd,
            private=private,
        )
        return node

    def _expose(self, d: Path) -> list[str]:
        """Mount commands that let the node users reach self.readable (see the class docstring)."""
        closed: dict[Path, list[Path]] = {}
        for path in self.readable:
            ancestors = [a for a in reversed(path.parents) if not os.stat(a).st_mode & 0o001]
            if ancestors:
                closed.setdefault(ancestors[0], []).append(path)
        commands = []
        for k, (top, paths) in enumerate(closed.items()):
            stages = []
            for j, path in enumerate(paths):
                stage = d / f"stage{k}-{j}"
                stage.mkdir()
                stages.append(stage)
                commands.append(f"mount --bind {path} {stage} && ")
            commands.append(f"mount -t tmpfs -o mode=755 tmpfs {top} && ")
            for stage, path in zip(stages, paths, strict=True):
                commands.append(f"mkdir -p {path} && mount --bind {stage} {path} && ")
        return commands

    def _wait_ssh(self, node: BedNode) -> None:
        deadline = time.monotonic() + 20
        log = node.client_key.parent / "sshd.log"
        while True:
            if node.sshd is not None and node.sshd.poll() is not None:
                raise RuntimeError(f"sshd of {node.name} exited {node.sshd.returncode}: {log.read_text()}")
            try:
                socket.create_connection((node.ip, node.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd of {node.name} does not listen on {node.ip}: {log.read_text()}") from None
                time.sleep(0.1)
        # Trust it the way docs/operations.md tells users to.
        scan = _run("ssh-keyscan", "-t", "ed25519", node.ip)
        node.known_hosts.write_text(scan.stdout)

    # -- the provider's NAT -------------------------------------------------------------------------

    def _firewall(self, netns: str) -> None:
        """The node's rules, replaced whole (nftables, in the node's namespace only)."""
        ports = ", ".join(str(p) for p in sorted(set(self.controller_ports)))
        storage = f"ip daddr {self.controller_ip} tcp dport {{ {ports} }} accept\n" if ports else ""
        rules = (
            "flush ruleset\n"
            "table inet rented {\n"
            "  chain inbound {\n"
            "    type filter hook input priority 0; policy drop;\n"
            '    iif "lo" accept\n'
            "    ct state established,related accept\n"
            "    tcp dport 22 accept\n"
            "  }\n"
            "  chain outbound {\n"
            "    type filter hook output priority 0; policy accept;\n"
            '    oif "lo" accept\n'
            "    ct state established,related accept\n"
            f"    {storage}"
            f"    ip daddr {self.prefix}.0/24 meta l4proto tcp reject with tcp reset\n"
            f"    ip daddr {self.prefix}.0/24 reject\n"
            "  }\n"
            "}\n"
        )
        result = subprocess.run(
            ["ip", "netns", "exec", netns, "nft", "-f", "-"], input=rules, capture_output=True, text=True, timeout=60
        )
        if result.returncode != 0:
            raise TestBedUnavailable(f"nftables in {netns}: {result.stderr.strip()} (Debian: nftables)")

    def allow_to_controller(self, port: int) -> None:
        """Let firewalled nodes (now and later) reach this port of the controller's address."""
        self.controller_ports.append(port)
        if self.firewall:
            for node in self.nodes:
                self._firewall(node.netns)

    # -- helpers for tests ---------------------------------------------------------------------------

    def in_node(self, node: BedNode, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a command as root inside the node's network namespace (for assertions)."""
        return subprocess.run(
            ["ip", "netns", "exec", node.netns, *cmd], capture_output=True, text=True, timeout=timeout
        )

    def node_processes(self, node: BedNode) -> list[int]:
        """Live processes of the node's user (zombies left to an init that does not reap them excluded)."""
        live = []
        for pid in _pids_of_uid(node.uid):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            if stat[stat.rindex(")") + 2] != "Z":
                live.append(pid)
        return live

    # -- nodes that come and go (a provider simulator's rented instances) ------------------------------

    def add_node(self, gpus: int) -> BedNode:
        """One more node on the running bed, reachable over SSH when this returns; removed by
        `remove_node` or `close()`."""
        i = self.count
        self.count += 1
        self.gpus.append(gpus)
        node = self._add_node(i)
        self.nodes.append(node)
        self._wait_ssh(node)
        return node

    def add_container_node(self, gpus: int, run: Callable[[BedNode, Path], Callable[[], None]]) -> BedNode:
        """A node whose sshd and all else run in a container in the node's namespace, logging in as root:
        `run(node, nvidia_smi)` starts it (the stand-in to mount) and returns what ends it."""
        i = self.count
        self.count += 1
        self.gpus.append(gpus)
        ns, ip, d = self._namespace(i)
        smi = stand_in_nvidia_smi(d / "nvidia-smi", gpus, node_index=i)
        node = BedNode(f"node{i}", ip, ns, "root", Path("/root"), d / "client_key", d / "known_hosts", gpus)
        self.nodes.append(node)
        node.stop = run(node, smi)
        self._wait_ssh(node)
        return node

    def authorize(self, node: BedNode, public_key: str, env: dict[str, str] | None = None) -> None:
        """Let `public_key` log in as the node's user too (with the same PATH as the bed's own key, and
        `env`: what a rented container's environment holds, such as its instance-scoped API key)."""
        keys = node.client_key.parent / "authorized_keys"
        prefix = keys.read_text().split(" ", 1)[0]  # environment="PATH=..."
        extra = "".join(f',environment="{k}={v}"' for k, v in (env or {}).items())
        with keys.open("a") as f:
            f.write(f"{prefix}{extra} {public_key.strip()}\n")

    def remove_node(self, node: BedNode) -> None:
        """End the node's processes and remove its namespace, link, user and files (as close() does)."""
        self._stop(node)
        i = node.name.removeprefix("node")  # named as in _add_node
        ns, veth, user = node.netns, f"{self.tag}v{i}", node.user
        errors = []
        for kind, name, cmd in (
            ("netns", ns, ("ip", "netns", "del", ns)),
            ("link", veth, ("ip", "link", "del", veth)),
            ("user", user, ("userdel", user)),
        ):
            if (kind, name) in self._created:
                self._created.remove((kind, name))
                r = _run(*cmd, check=False)
                if r.returncode != 0 and not (kind == "link" and "Cannot find device" in r.stderr):
                    errors.append(f"removing {kind} {name}: {r.stderr.strip()}")
        shutil.rmtree(node.client_key.parent, ignore_errors=True)
        self.nodes.remove(node)
        if errors:
            raise RuntimeError("; ".join(errors))

    # -- teardown --------------------------------------------------------------------------------------

    @staticmethod
    def _stop(node: BedNode) -> None:
        if node.stop is not None:
            node.stop()
            return
        try:
            kill_uid(node.uid)
        except KeyError:
            pass
        if node.sshd is not None and node.sshd.poll() is None:
            try:
                os.killpg(node.sshd.pid, signal.SIGTERM)
                node.sshd.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(node.sshd.pid, signal.SIGKILL)
                node.sshd.wait(timeout=10)

    def close(self) -> None:
        """Remove everything start() created, in reverse; keeps going past errors, then raises the first."""
        errors: list[str] = []
        for node in self.nodes:
            self._stop(node)
        while self._created:
            kind, name = self._created.pop()
            if kind == "netns":
                r = _run("ip", "netns", "del", name, check=False)
            elif kind == "link":
                r = _run("ip", "link", "del", name, check=False)
                if "Cannot find device" in r.stderr:  # a veth goes with its namespace
                    continue
            elif kind == "user":
                r = _run("userdel", name, check=False)
            else:
                shutil.rmtree(name, ignore_errors=True)
                continue
            if r.returncode != 0:
                errors.append(f"removing {kind} {name}: {r.stderr.strip()}")
        self.nodes = []
        if errors:
            raise RuntimeError("; ".join(errors))
