"""Rented instances that are containers: the provider simulator's hooks (tests/cluster/provider_sim.py) that
start each created instance as a container of an image in a new namespace node of the test bed, and
attach the controller's key the way Vast does; and the rental settings that log in to such a container.
Used by tests/images/test_rented_image.py and bench/rented_image.py."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable
from pathlib import Path

from orchestrator.sweeps.rented import RentalConfig
from tests.cluster.provider_sim import Hooks, SimInstance
from tests.cluster.rental import bed_rental
from tests.cluster.testbed import BedNode, TestBed
from tests.images.podman import Podman


def image_hooks(bed: TestBed, podman: Podman, image: str, gpus: int) -> Hooks:
    """Each created instance is a container of `image` in a new namespace node of `bed`."""
    containers: dict[str, str] = {}  # node's namespace -> its container

    def run(node: BedNode, nvidia_smi: Path) -> Callable[[], None]:
        cid = podman(
            "run", "-d", "--network", f"ns:/run/netns/{node.netns}", "--shm-size", "1g",
            "-v", f"{nvidia_smi}:/usr/local/bin/nvidia-smi:ro", image,
        ).stdout.strip()
        containers[node.netns] = cid
        return lambda: podman("rm", "-f", "-t", "2", cid, check=False) and None

    def on_create(inst: SimInstance) -> tuple[str, int]:
        inst.handle = bed.add_container_node(gpus, run)
        return inst.handle.ip, 22

    def on_ssh_key(inst: SimInstance, key: str) -> None:  # what Vast does with an attached key
        append = f"printf '%s\\n' {shlex.quote(key.strip())} >> /root/.ssh/authorized_keys"
        podman("exec", containers[inst.handle.netns], "sh", "-c", append)

    return Hooks(on_create=on_create, on_ssh_key=on_ssh_key, on_destroy=lambda inst: bed.remove_node(inst.handle))


def container_rental(bed: TestBed, home: Path, image: str) -> RentalConfig:
    """The bed's rental settings for instances of `image`: root logs in, the image's Python runs the
    dead-man's switch."""
    rental = bed_rental(bed.tag, home)
    return dataclasses.replace(
        rental,
        image=image,
        login_user=lambda instance: "root",
        deadman=dataclasses.replace(rental.deadman, python="python3"),
    )
