"""A Vast "instance" rented through the real vastai SDK from the provider simulator is a real node of
the namespace test bed: its own namespace, IP and sshd, reached over SSH with the controller's key
(which reached it through attach_ssh), its stand-in GPUs probed; destroying it removes the node."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.fleet.probe import probe
from orchestrator.fleet.providers.base import InstanceLabel, LaunchSpec
from orchestrator.fleet.providers.lifecycle import Timing, create_or_find, destroy_confirmed, wait_reachable
from orchestrator.fleet.providers.offers import choose_offers
from orchestrator.fleet.providers.request import NodeRequest
from orchestrator.fleet.providers.vast import VastProvider
from orchestrator.fleet.shell import NodeShell
from tests.cluster import testbed
from tests.cluster.provider_hooks import bed_hooks
from tests.cluster.provider_sim import ProviderSim
from tests.cluster.provider_wire import vast_offer
from tests.cluster.testbed import TestBed

# The SDKs install apart from the project (their declared requirements conflict; README's first command).
pytest.importorskip("vastai", reason="the vastai SDK: pip install --no-deps vastai==1.9.1 runpod==1.12.0")
pytest.importorskip("runpod", reason="the runpod SDK: pip install --no-deps vastai==1.9.1 runpod==1.12.0")

KEY = "sk-test-rented-node-0123456789"


@pytest.fixture(scope="module")
def bed() -> Iterator[TestBed]:
    """A bed with no nodes of its own: every node comes from a rental."""
    try:
        TestBed.check()
    except testbed.TestBedUnavailable as exc:  # imported by module: pytest would collect a Test* class
        pytest.skip(f"cluster test bed unavailable: {exc}")
    with TestBed(nodes=0, gpus=[], tag=f"abr{os.getpid() % 100000}") as b:
        yield b


def test_a_rented_vast_instance_is_a_real_node_reached_over_ssh(bed: TestBed, tmp_path: Path) -> None:
    key = tmp_path / "controller_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    offers = [vast_offer(201, dph_total=1.8), vast_offer(202, dph_total=1.5)]
    with ProviderSim(KEY, vast_offers=offers, hooks=bed_hooks(bed)) as sim:
        provider = VastProvider(KEY, server_url=sim.url)
        request = NodeRequest(provider="vast", gpu="RTX_4090", gpus_per_node=4, nodes=1, max_price_per_gpu_hour=0.45)
        offer = choose_offers(provider.search(request), request)[0]
        assert offer.offer_id == "202"
        spec = LaunchSpec(
            image="ablate/worker:test",
            disk_gb=50,
            ssh_public_key=key.with_suffix(".pub").read_text(),
            label=InstanceLabel("night", 3),
        )
        timing = Timing(reachable_s=30, poll_s=0.2)
        [made], _ = create_or_find(provider, offer, spec, set(), timing)  # the sweep runner's steps
        instance = wait_reachable(provider, made.instance_id, timing)

        node = sim.instances[instance.instance_id].handle
        assert (instance.ssh_host, instance.ssh_port) == (node.ip, 22)
        # Vast logs in as root; a bed node's login user is its own (root's processes are the machine's).
        row = SimpleNamespace(
            id=None,
            name=f"vast-{instance.instance_id}",
            host=instance.ssh_host,
            port=instance.ssh_port,
            user=node.user,
            key_path=str(key),
            known_hosts_path=str(node.known_hosts),
        )
        with NodeShell.open(row) as shell:  # type: ignore[arg-type]
            gpus = probe(shell)["gpus"]
            address = shell.run("hostname -I").stdout.split()
        assert len(gpus) == 4 and address == [node.ip]
        assert [i.instance_id for i in provider.list_owned("night")] == [instance.instance_id]

        assert destroy_confirmed(provider, instance.instance_id, Timing(poll_s=0.2, destroy_s=30))
        assert sim.live() == [] and provider.list_owned("night") == []
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert node.netns not in netns
        assert subprocess.run(["id", node.user], capture_output=True).returncode != 0
        assert node not in bed.nodes
        record = sim.instances[instance.instance_id]
        assert record.ended is not None and sim.bill() == pytest.approx(1.5 * (record.ended - record.created) / 3600)
