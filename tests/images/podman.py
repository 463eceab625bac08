"""Build and run docker/'s images with Podman on this machine, as an operator would without a registry.

- `Podman`: podman with its own containers.conf (runc, and no default ulimits: this machine refuses
  setrlimit, and Debian's crun does not run on its hybrid cgroups), builds with chroot isolation.
- `local_base`: a Debian bookworm root filesystem made by `debootstrap --variant=minbase` with Debian's
  Python, imported as a local image (no base can be pulled here); made once, then reused from Podman's store.
- `build_images`: both images from the repository with CPU torch (the wheel pip finds on this machine),
  through every pip install's options (`PIP_ARGS`): this machine's CA bundle, for a TLS-intercepting proxy;
  the tree's version from setuptools-scm (`ABLATE_VERSION`: the build context has no .git).

Usable from pytest (tests/images/test_images.py) and from bench/ scripts (bench/images.py).
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("podman", "buildah", "runc", "debootstrap")
INSTALL = "apt-get install -y buildah podman runc debootstrap"
BASE = "localhost/ablate-debian-base:bookworm"
CONTROLLER, WORKER = "localhost/ablate-controller:test", "localhost/ablate-worker:test"
CONTAINERS_CONF = '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n'


class ImagesUnavailable(RuntimeError):
    """This machine cannot build images (a tool is missing, or not root); the message says what to install."""


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists()]


@dataclass
class Built:
    image: str
    seconds: float
    size_bytes: int


class Podman:
    def __init__(self, workdir: Path) -> None:
        missing = missing_tools()
        if missing:
            raise ImagesUnavailable(f"{', '.join(missing)} not installed: {INSTALL}")
        self.workdir = workdir
        self.conf = workdir / "containers.conf"
        self.conf.write_text(CONTAINERS_CONF)

    def __call__(
        self, *args: str, timeout: float = 600, check: bool = True, **kw: object
    ) -> subprocess.CompletedProcess[str]:
        """`podman ARGS` with this containers.conf; raises with its stderr's tail on failure (`check`)."""
        env = {**os.environ, "CONTAINERS_CONF": str(self.conf)}
        cmd = ["podman", *args]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, **kw)  # type: ignore[call-overload]
        if check and result.returncode != 0:
            tail = (result.stderr or result.stdout)[-4000:]
            raise RuntimeError(f"podman {' '.join(args[:3])} ... exited {result.returncode}:\n{tail}")
        return result

    def exists(self, image: str) -> bool:
        return self("image", "exists", image, check=False).returncode == 0

    def size(self, image: str) -> int:
        return int(self("image", "inspect", "--format", "{{.Size}}", image).stdout.strip())

    def build(
        self, dockerfile: str, tag: str, build_args: dict[str, str], volumes: list[str], target: str | None = None
    ) -> Built:
        args = ["build", "--isolation", "chroot", "-f", f"docker/{dockerfile}", "-t", tag]
        args += ["--target", target] if target else []
        for key, value in build_args.items():
            args += ["--build-arg", f"{key}={value}"]
        for volume in volumes:
            args += ["-v", volume]
        started = time.monotonic()
        self(*args, ".", timeout=1800, cwd=ROOT)
        return Built(tag, time.monotonic() - started, self.size(tag))


def local_base(podman: Podman, name: str = BASE) -> str:
    """The bookworm base with python3 and its venv module, made once with debootstrap (about 35 s)."""
    if podman.exists(name):
        return name
    with tempfile.TemporaryDirectory(prefix="ablate-base-") as tmp:
        root = Path(tmp) / "root"
        subprocess.run(
            ["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates", "bookworm",
             str(root), "http://deb.debian.org/debian"],
            check=True, capture_output=True, timeout=900,
        )
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (root / cache).glob("*"):
                if entry.is_file():
                    entry.unlink()
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        podman("import", "--change", 'CMD ["/bin/bash"]', "-", name, stdin=tar.stdout, timeout=600)
        tar.wait()
    return name


def torch_wheel(into: Path) -> Path:
    """The torch wheel this machine's pip takes for the running version (here the CPU build on disk)."""
    import torch

    into.mkdir(parents=True, exist_ok=True)
    version = torch.__version__
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(into), f"torch=={version}"],
        check=True, timeout=900,
    )
    return next(into.glob("torch-*.whl"))


def build_images(podman: Podman) -> dict[str, Built]:
    """Both images from the repository on the local base, with CPU torch; their build times and sizes."""
    base = local_base(podman)
    wheels = podman.workdir / "wheels"
    wheel = torch_wheel(wheels)
    torch_version = wheel.name.split("-")[1]
    ca = os.environ.get("PIP_CERT") or ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt"
    args = {
        "BASE": base,
        "TORCH": f"torch=={torch_version}",
        "TORCH_PIP_ARGS": "--find-links /wheels",
        "PIP_ARGS": "--cert /run/host-ca.pem",
        # The tree's version as a wheel built here would carry it: a node from the worker image then holds
        # the code of a controller run from this tree (same commit) and bootstrap skips its install.
        "ABLATE_VERSION": subprocess.run([sys.executable, "-m", "setuptools_scm"], cwd=ROOT, capture_output=True,
                                         text=True, check=True, timeout=60).stdout.strip(),
    }
    volumes = [f"{wheels}:/wheels:ro", f"{ca}:/run/host-ca.pem:ro"]
    return {
        "worker": podman.build("worker.Dockerfile", WORKER, args, volumes),
        "controller": podman.build("controller.Dockerfile", CONTROLLER, args, volumes),
    }
