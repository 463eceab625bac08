"""Pretrained weights through their libraries' own download mechanisms (torchvision's weights API,
torch.hub), into torch's standard cache (`torch.hub.get_dir()`, i.e. $TORCH_HOME/hub), and the
switch that forbids downloading.

ABLATE_OFFLINE=1: nothing is downloaded; weights missing from the cache are an error that says how
to provide them. It is read where the weights load (a worker on a rented node decides for that node).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

from pydantic import TypeAdapter, ValidationError

OFFLINE_ENV = "ABLATE_OFFLINE"
DOWNLOAD_TIMEOUT_S = 60  # per socket operation: a network that drops packets fails instead of hanging a run


def offline() -> bool:
    """True when ABLATE_OFFLINE is set to a true value (1/true/yes/on); empty or unset means online."""
    value = os.environ.get(OFFLINE_ENV, "").strip()
    if not value:
        return False
    try:
        return TypeAdapter(bool).validate_python(value)
    except ValidationError:
        raise ValueError(f"{OFFLINE_ENV}={value!r} is not a boolean: use 1/true/yes/on or 0/false/no/off") from None


@contextlib.contextmanager
def download_timeout(seconds: float = DOWNLOAD_TIMEOUT_S) -> Iterator[None]:
    """torch.hub opens URLs without a timeout; bound each socket operation while downloading."""
    before = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(before)
