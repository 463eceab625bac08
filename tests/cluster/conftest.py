"""The namespace test bed as pytest fixtures: `testbed` (two nodes, two logical GPUs each) per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.testbed import TestBed, TestBedUnavailable


@pytest.fixture(scope="module")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestBed]:
    try:
        TestBed.check()
    except TestBedUnavailable as exc:
        pytest.skip(f"cluster test bed unavailable: {exc}")
    with TestBed(nodes=2, gpus=2) as bed:
        yield bed
