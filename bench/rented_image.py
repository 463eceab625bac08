"""What the worker image saves a rented night: fire -> first optimizer step, with and without the install.

On the namespace test bed, as root on Linux, with Podman (tests/images/podman.py). A schedule asks for one
node; the sweep runner rents it through the real vastai SDK from tests/cluster/provider_sim.py, whose
instance is a container in a firewalled namespace node (tests/images/image_nodes.py), and the real
launcher trains arm A for a few steps with a checkpoint every step. Two kinds of instance:
  - image:   the worker image (docker/worker.Dockerfile): bootstrap finds this version in /opt/venv and
             skips the install;
  - install: the same Dockerfile's `node` stage (sshd and Debian's Python, as a provider's stock image):
             bootstrap's default install at fire time, a fresh venv from a wheelhouse of the whole
             dependency closure copied over SFTP (the node reaches no index). CPU torch here: on a GPU
             node the install fetches CUDA torch, 4.9 GB more (docs/benchmarks.md), so this is a floor.
Measured per night: fire -> first optimizer step (the fire tick to the first metric row, step 1), and the
install step's own seconds (its commands' durations).

    python bench/rented_image.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import func, select  # noqa: E402

from orchestrator.db.models import Event, Grid, Metric, Run, Sweep  # noqa: E402
from orchestrator.db.session import session_scope, upgrade  # noqa: E402
from orchestrator.fleet.bootstrap import BootstrapConfig  # noqa: E402
from orchestrator.fleet.providers.vast import VastProvider  # noqa: E402
from orchestrator.sweeps.runner import SweepRunner  # noqa: E402
from orchestrator.vocabulary import ACTIVE_SWEEP_STATES  # noqa: E402
from tests.cluster.provider_sim import ProviderSim  # noqa: E402
from tests.cluster.provider_wire import vast_offer  # noqa: E402
from tests.cluster.rental import due_rented_night  # noqa: E402
from tests.cluster.testbed import TestBed  # noqa: E402
from tests.images.image_nodes import container_rental, image_hooks  # noqa: E402
from tests.images.podman import WORKER, Podman, build_images, local_base  # noqa: E402
from tests.kit.bed import launcher_process  # noqa: E402
from tests.kit.settings import tiny_overrides  # noqa: E402

KEY = "sk-bench-image-night-0123456789"
STOCK = "localhost/ablate-node:bench"


def wheelhouse(into: Path) -> tuple[Path, Path]:
    """This project's wheel and its whole dependency closure as wheels (CPU torch: this machine's pip)."""
    if not any(into.glob("ablate_dit-*.whl")):
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "-w", str(into), ".", "torch==2.13.0"],
                       cwd=ROOT, check=True, timeout=1800)
    return next(into.glob("ablate_dit-*.whl")), into


def night(podman: Podman, image: str, config: BootstrapConfig, tmp: Path, tag: str) -> dict[str, float]:
    database_url = f"sqlite:///{tmp / 'ablate.db'}"
    upgrade(database_url)
    storage = tmp / "storage"
    overrides = tiny_overrides(5)
    overrides["schedule"]["checkpoint_every"] = 1  # the first record is the first optimizer step
    with session_scope(database_url) as session:
        due_rented_night(session, "bench-image", ["A"], overrides, nodes=1)
    with TestBed(nodes=0, gpus=[], tag=tag, firewall=True) as bed, ProviderSim(
        KEY, vast_offers=[vast_offer(701, dph_total=1.2)], hooks=image_hooks(bed, podman, image, gpus=1)
    ) as sim:
        rental = container_rental(bed, tmp / "controller", image)
        runner = SweepRunner(database_url, storage, node_config=config,
                             providers={"vast": VastProvider(KEY, server_url=sim.url)}, rental=rental)
        with launcher_process(database_url, storage, tmp / "launcher.log", f"bench-{tag}"):
            fired = time.monotonic()
            runner.tick()
            first = None
            while True:
                with session_scope(database_url) as session:
                    sweep = session.scalars(select(Sweep)).one()
                    rows = session.scalar(select(func.count(Metric.id)).join(Run).join(Grid))
                if first is None and rows:
                    first = time.monotonic() - fired
                if sweep.state not in ACTIVE_SWEEP_STATES:
                    break
                if time.monotonic() - fired > 1800:
                    raise RuntimeError("the night did not end within 30 minutes")
                runner.tick()
                time.sleep(0.2)
        if first is None:
            raise RuntimeError(f"the night ended {sweep.state} with no step: {sweep.error}")
        with session_scope(database_url) as session:
            commands = session.scalars(select(Event).where(Event.kind == "node.command")).all()
            installs = [e for e in commands if "pip install" in e.message or " -m venv " in e.message]
            install = sum(e.data["duration_s"] for e in installs)
    return {"first_step_s": first, "install_s": install}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ablate-bench-image-"))
    podman = Podman(work)
    build_images(podman)
    ca_args = {"BASE": local_base(podman), "PIP_ARGS": "--cert /run/host-ca.pem"}
    podman.build("worker.Dockerfile", STOCK, ca_args, ["/etc/ssl/certs/ca-certificates.crt:/run/host-ca.pem:ro"],
                 target="node")
    package, wheels = wheelhouse(Path(tempfile.gettempdir()) / "ablate-bench-wheelhouse")
    env = {"ABLATE_OFFLINE": "1"}
    kinds = {
        "image": (WORKER, BootstrapConfig(env=env, command_timeout_s=1800)),
        "install": (STOCK, BootstrapConfig(env=env, package=package, wheelhouse=wheels, command_timeout_s=1800)),
    }
    results: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    for r in range(args.repeats):
        for k, (image, config) in kinds.items():
            tmp = Path(tempfile.mkdtemp(prefix=f"night-{k}-", dir=work))
            results[k].append(night(podman, image, config, tmp, tag=f"abb{r}{k[0]}"))
            print(k, results[k][-1], flush=True)
    print("\n| instance image | fire -> first optimizer step (s) | of which install (s) |\n|---|---|---|")
    for k, rows in results.items():
        first = ", ".join(f"{x['first_step_s']:.1f}" for x in rows)
        install = ", ".join(f"{x['install_s']:.1f}" for x in rows)
        median = statistics.median(x["first_step_s"] for x in rows)
        print(f"| {k} | {first} (median {median:.1f}) | {install} |")


if __name__ == "__main__":
    main()
