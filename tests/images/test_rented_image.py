"""A rented night whose instances start from the worker image: nothing is installed at fire time.

The provider simulator (tests/cluster/provider_sim.py) serves the Vast API to the real vastai SDK; each
instance it creates is a container of the worker image in a firewalled namespace node of the test bed
(inbound SSH only, outbound only to the controller's storage port), its sshd and host key its own, the
controller's key attached through the API as Vast does. The night's bootstrap finds the image's
environment, checks the version its Python reports and skips the install; the real launcher (its own
process) trains the grid there, results are copied back, and destroying the instances removes the
containers. Only the providers' HTTP API and `nvidia-smi` are stand-ins.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from orchestrator.db.models import Event, Grid, RentedInstance, Sweep
from orchestrator.db.session import session_scope
from orchestrator.fleet.bootstrap import BootstrapConfig
from orchestrator.fleet.providers.vast import VastProvider
from orchestrator.sweeps.runner import SweepRunner
from orchestrator.vocabulary import RentedState, RunState, SweepState
from tests.cluster import testbed
from tests.cluster.provider_sim import ProviderSim
from tests.cluster.provider_wire import vast_offer
from tests.cluster.rental import due_rented_night
from tests.cluster.testbed import TestBed
from tests.images.image_nodes import container_rental, image_hooks
from tests.images.podman import WORKER, Built, Podman
from tests.kit.bed import launcher_process
from tests.kit.settings import tiny_overrides

pytest.importorskip("vastai", reason="the vastai SDK: pip install --no-deps vastai==1.9.1 runpod==1.12.0")

KEY = "sk-image-rented-night-0123456789"
OFFERS = [vast_offer(601, dph_total=1.2)]


@pytest.fixture(scope="module")
def bed() -> Iterator[TestBed]:
    """No nodes of its own: each comes from a rental, as a container. The controller's storage dir, where
    workers write and copy-back reads, lies in each container's own filesystem."""
    try:
        TestBed.check()
    except testbed.TestBedUnavailable as exc:  # by module: pytest would collect a Test* class
        pytest.skip(f"cluster test bed unavailable: {exc}")
    with TestBed(nodes=0, gpus=[], tag=f"abi{os.getpid() % 100000}", firewall=True) as b:
        yield b


def test_a_night_rented_from_the_worker_image_skips_the_install_and_trains(
    images: tuple[Podman, dict[str, Built]], database_url: str, bed: TestBed, tmp_path: Path
) -> None:
    podman, _ = images
    storage = tmp_path / "storage"
    with session_scope(database_url) as session:
        due_rented_night(session, "image-night", ["A", "B"], tiny_overrides(20), nodes=1)

    with ProviderSim(KEY, vast_offers=OFFERS, hooks=image_hooks(bed, podman, WORKER, gpus=2)) as sim:
        rental = container_rental(bed, tmp_path / "controller", WORKER)
        # The defaults, as `ablate serve` has them: an install into {remote_dir}/venv that needs a package
        # (none is set: it would fail), unless bootstrap finds this version already in the image.
        config = BootstrapConfig(env={"ABLATE_OFFLINE": "1"}, command_timeout_s=120)
        runner = SweepRunner(
            database_url, storage, node_config=config, providers={"vast": VastProvider(KEY, server_url=sim.url)},
            rental=rental,
        )
        log = tmp_path / "launcher.log"
        with launcher_process(database_url, storage, log, "ablate-image-night"):
            fired = time.monotonic()
            runner.tick()
            with session_scope(database_url) as session:
                sweep = session.scalars(select(Sweep)).one()
            assert sweep.state == SweepState.running, sweep.error
            deadline = time.monotonic() + 480
            while sweep.state not in (SweepState.completed, SweepState.failed, SweepState.stopped):
                assert time.monotonic() < deadline, f"sweep still {sweep.state}; launcher: {log.read_text()[-3000:]}"
                runner.tick()
                time.sleep(1.0)
                with session_scope(database_url) as session:
                    sweep = session.get_one(Sweep, sweep.id)
            print(f"fire -> sweep ended: {time.monotonic() - fired:.1f} s")

        assert sweep.state == SweepState.completed, sweep.error
        with session_scope(database_url) as session:
            runs = list(session.get_one(Grid, sweep.grid_id).runs)
            [instance] = session.scalars(select(RentedInstance).where(RentedInstance.sweep_id == sweep.id))
            skipped = session.scalars(select(Event).where(Event.kind == "node.install_skipped")).all()
        assert {r.state for r in runs} == {RunState.completed}
        assert [e.data["venv"] for e in skipped] == ["/opt/venv"]
        assert instance.state == RentedState.destroyed
        for run in runs:
            assert (Path(sweep.results_dir) / "runs" / f"{run.id}-{run.arm}" / "best.pt").is_file()
        assert sim.live() == [] and bed.nodes == []
        assert podman("ps", "-q", "--filter", f"ancestor={WORKER}").stdout.strip() == ""
