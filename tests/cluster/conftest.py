"""The namespace test bed as pytest fixtures (what runs on it is in tests/kit/bed.py).

`testbed`: per module, a worker bed (tests.kit.bed.worker_bed) of two nodes with two logical GPUs each,
firewalled as a provider's NAT leaves a rented container (inbound SSH only; nothing new to the controller
or the other nodes but storage); a module marked `pytest.mark.bed(nodes=N)` gets N (0: every node comes
from a rental). Each node runs its own Ray, started by bootstrap; nothing joins the controller. Skips
when this machine cannot host a bed.
`s3_on_bridge`: moto's S3 on the controller's bridge address with a bucket (tests.kit.bed.aws_profile
puts the usual credentials files in a node user's home).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest

from tests.cluster.testbed import TestBed, TestBedUnavailable
from tests.kit.bed import BUCKET, CREDENTIALS, worker_bed


@pytest.fixture(scope="module")
def testbed(request: pytest.FixtureRequest) -> Iterator[TestBed]:
    marker = request.node.get_closest_marker("bed")
    nodes = marker.kwargs["nodes"] if marker is not None else 2
    try:
        TestBed.check()
    except TestBedUnavailable as exc:
        pytest.skip(f"cluster test bed unavailable: {exc}")
    with worker_bed(nodes) as bed:
        yield bed


@pytest.fixture(scope="module")
def s3_on_bridge(testbed: TestBed) -> Iterator[str]:
    """moto's S3 server on the controller's bridge address, a bucket in it; the nodes' firewalls let
    them reach this port of the controller and no other (storage is what a rented node may reach)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address=testbed.controller_ip, port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    testbed.allow_to_controller(port)
    endpoint = f"http://{host}:{port}"
    from worker.checkpoint_store import open_fs

    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update(zip(names, (*CREDENTIALS, "us-east-1"), strict=True))
    try:
        # moto keeps its buckets in process-wide state that outlives an earlier module's server: start
        # empty (else mkdir meets that module's bucket: FileExistsError), and let fsspec forget its listing.
        httpx.post(f"{endpoint}/moto-api/reset", timeout=30).raise_for_status()
        fs, _ = open_fs(f"s3://{BUCKET}", {"endpoint_url": endpoint})
        fs.invalidate_cache()
        fs.mkdir(BUCKET)
        yield endpoint
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
