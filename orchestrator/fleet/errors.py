"""The fleet's errors: each message is one line the user can act on (the API answers 404/409/422/424)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from orchestrator.errors import Conflict, InvalidBody, NotFound


class NodeError(RuntimeError):
    """A node operation that could not be done; the message is one line the user can act on."""


class NodeNotFound(NotFound, NodeError):
    """No node of that name."""


class NodeConflict(Conflict, NodeError):
    """The name is taken, or a schedule still uses the node."""


class NodeInvalid(InvalidBody, NodeError):
    """A node body whose key files are not where the controller allows them."""


class HostKeyError(NodeError):
    """The server's host key is unknown or changed: refused, with its fingerprint and how to trust it."""


@contextmanager
def remote_errors(name: str) -> Iterator[None]:
    """Anything that goes wrong on the way to the node, as a NodeError naming it (the API answers 424,
    the CLI prints one line): SSH and socket errors, and invalid ABLATE_NODE_* settings."""
    import paramiko
    from pydantic import ValidationError

    try:
        yield
    except NodeError:
        raise
    except ValidationError as exc:  # BootstrapConfig: the controller's ABLATE_NODE_* settings
        raise NodeError(f"node {name!r}: invalid ABLATE_NODE_ settings: {exc}") from None
    except (paramiko.SSHException, OSError, EOFError, ValueError) as exc:
        raise NodeError(f"node {name!r}: {type(exc).__name__}: {exc}") from None


# -- SSH ----------------------------------------------------------------------------------------------


def error_reason(exc: BaseException) -> str:
    """A NodeError's own line; anything else with its type, which is the useful part of an OSError."""
    return str(exc) if isinstance(exc, NodeError) else f"{type(exc).__name__}: {exc}"
