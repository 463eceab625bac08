"""The images, built once per test run (Podman's layer cache makes a rebuild of unchanged code take seconds)."""

from __future__ import annotations

import os

import pytest

from tests.images.podman import Built, ImagesUnavailable, Podman, build_images


@pytest.fixture(scope="session")
def images(tmp_path_factory: pytest.TempPathFactory) -> tuple[Podman, dict[str, Built]]:
    """Podman and both images (worker, controller) built from this checkout; skips where they cannot be built."""
    if os.geteuid() != 0:
        pytest.skip("building images needs root (podman's store, debootstrap)")
    try:
        podman = Podman(tmp_path_factory.mktemp("podman"))
    except ImagesUnavailable as exc:
        pytest.skip(str(exc))
    built = build_images(podman)
    for b in built.values():
        print(f"built {b.image} in {b.seconds:.0f} s: {b.size_bytes / 1e9:.2f} GB")
    return podman, built
