"""The test bed itself: each node is its own host (user, home, host key, IP) reached over real SSH."""

from __future__ import annotations

import os
import subprocess

from orchestrator.fleet.probe import probe
from orchestrator.fleet.shell import NodeShell
from tests.cluster.testbed import TestBed


class _Row:
    """What NodeShell.open reads from a registered node."""

    def __init__(self, node) -> None:  # noqa: ANN001
        self.id, self.name, self.host, self.port = None, node.name, node.ip, node.port
        self.user, self.key_path, self.known_hosts_path = node.user, str(node.client_key), str(node.known_hosts)


def test_each_node_is_its_own_ssh_host_with_its_own_gpus(testbed: TestBed) -> None:
    seen = set()
    for node in testbed.nodes:
        with NodeShell.open(_Row(node)) as shell:
            found = probe(shell)
            whoami = shell.run("id -un; echo $HOME; hostname -I").stdout.split()
        assert [g["index"] for g in found["gpus"]] == list(range(node.gpus))
        assert whoami[:2] == [node.user, str(node.home)]
        assert whoami[2] == node.ip  # the namespace has only its own address
        seen.add(node.known_hosts.read_text().split()[-1])
    assert len(seen) == len(testbed.nodes)  # one host key per node


def test_sshd_listens_only_on_the_node_address(testbed: TestBed) -> None:
    node = testbed.nodes[0]
    listening = testbed.in_node(node, "ss", "-Hltn").stdout
    ports = [line.split()[3] for line in listening.splitlines()]
    assert f"{node.ip}:22" in ports
    assert not any(p.endswith(":22") and p != f"{node.ip}:22" for p in ports)
    # The controller reaches it over the bridge; another node does not (the bed's provider NAT).
    import socket

    with socket.create_connection((node.ip, 22), timeout=5) as sock:
        assert sock.recv(7) == b"SSH-2.0"
    other = testbed.nodes[1]
    refused = testbed.in_node(other, "bash", "-c", f"exec 3<>/dev/tcp/{node.ip}/22 && head -c 7 <&3")
    assert refused.returncode != 0 and "refused" in refused.stderr, refused.stderr


def test_close_removes_everything_it_created() -> None:
    bed = TestBed(nodes=1, gpus=1, tag=f"abc{os.getpid() % 100000}")
    with bed:
        node = bed.nodes[0]
        uid = node.uid
        sshd = node.sshd
        assert sshd is not None and sshd.poll() is None
    assert sshd.poll() is not None
    assert node.netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert subprocess.run(["ip", "link", "show", bed.bridge], capture_output=True).returncode != 0
    assert subprocess.run(["id", node.user], capture_output=True).returncode != 0
    assert not bed.root.exists()
    assert not [p for p in os.listdir("/proc") if p.isdigit() and os.stat(f"/proc/{p}").st_uid == uid]
