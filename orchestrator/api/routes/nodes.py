"""Nodes: rented GPU machines reached over SSH. Register, list, probe, bootstrap, drain, tear down, remove.

SSH work runs in the request (FastAPI's thread pool); a node that cannot be reached or whose host key
is refused answers 424 with the reason (fingerprint and how to trust it included).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from fastapi import APIRouter, HTTPException, Response, status
from pydantic import BaseModel, ValidationError

from orchestrator.api.deps import AuthDep, SessionDep, SettingsDep
from orchestrator.db.models import Node
from orchestrator.nodes import (
    BootstrapConfig,
    NodeCreate,
    NodeError,
    add_node,
    bootstrap_node,
    drain_node,
    find_node,
    key_path_problems,
    list_nodes,
    node_public,
    probe_node,
    remove_node,
    teardown_node,
)

router = APIRouter(prefix="/api/nodes", tags=["nodes"])

_AUTH = {401: {"description": "missing or wrong bearer token"}}
_404 = {404: {"description": "no such node"}}
_424 = {424: {"description": "the node could not be reached, refused its host key, or a command failed"}}


class Gpu(BaseModel):
    index: int
    name: str
    memory_mib: int
    driver: str
    uuid: str


class NodePublic(BaseModel):
    id: int
    name: str
    host: str
    port: int
    user: str
    key_path: str
    known_hosts_path: str | None
    price_per_hour: float
    state: str  # registered | ready | joined | drained
    gpus: list[Gpu]
    last_probe: dict[str, Any]
    created_at: datetime


class ProbeResult(BaseModel):
    node: str
    hostname: str
    gpus: list[Gpu]
    free_disk_gb: float
    python: str
    probed_at: str


def _node_or_404(session: SessionDep, name: str) -> Node:
    node = find_node(session, name)
    if node is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no node named {name!r}")
    return node


@contextmanager
def _remote_errors(name: str) -> Iterator[None]:
    """Anything that goes wrong on the way to the node answers 424 with the reason, never a 500."""
    import paramiko

    try:
        yield
    except NodeError as exc:
        raise HTTPException(status.HTTP_424_FAILED_DEPENDENCY, detail=str(exc)) from None
    except ValidationError as exc:  # ABLATE_NODE_* settings of the controller
        raise HTTPException(
            status.HTTP_424_FAILED_DEPENDENCY, detail=f"node {name!r}: invalid ABLATE_NODE_ settings: {exc}"
        ) from None
    except (paramiko.SSHException, OSError, EOFError, ValueError) as exc:
        raise HTTPException(
            status.HTTP_424_FAILED_DEPENDENCY, detail=f"node {name!r}: {type(exc).__name__}: {exc}"
        ) from None


@router.get("", response_model=list[NodePublic], responses=_AUTH)
def get_nodes(session: SessionDep, _: AuthDep) -> list[dict[str, Any]]:
    return [node_public(n) for n in list_nodes(session)]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=NodePublic,
    responses={**_AUTH, 409: {"description": "name taken"}},
)
def post_node(body: NodeCreate, session: SessionDep, settings: SettingsDep, _: AuthDep) -> dict[str, Any]:
    """Register a node. Its host key must already be in the known-hosts file (`ssh-keyscan`); its key
    and known-hosts files must lie under ABLATE_SSH_KEY_DIRS on the controller."""
    problems = key_path_problems(body, settings.ssh_key_dirs)
    if problems:
        detail = [{"loc": ["body", field], "msg": msg, "type": "value_error"} for field, msg in problems.items()]
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=detail)
    if find_node(session, body.name) is not None:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=f"a node named {body.name!r} already exists")
    return node_public(add_node(session, body))


@router.get("/{name}", response_model=NodePublic, responses={**_AUTH, **_404})
def get_node(name: str, session: SessionDep, _: AuthDep) -> dict[str, Any]:
    return node_public(_node_or_404(session, name))


@router.delete(
    "/{name}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses={**_AUTH, **_404, 409: {"description": "a schedule uses it"}},
)
def delete_node(name: str, session: SessionDep, _: AuthDep) -> Response:
    """Forget the node (the machine itself is not touched)."""
    _node_or_404(session, name)
    try:
        remove_node(session, name)
    except NodeError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from None
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{name}/probe", response_model=ProbeResult, responses={**_AUTH, **_404, **_424})
def post_probe(name: str, session: SessionDep, settings: SettingsDep, _: AuthDep) -> dict[str, Any]:
    """GPUs from nvidia-smi, free disk (GB) and Python version, over SSH; stored on the node."""
    _node_or_404(session, name)
    session.commit()  # the probe writes through its own sessions
    with _remote_errors(name):
        return probe_node(settings.database_url, name)


def _lifecycle(
    name: str, session: SessionDep, settings: SettingsDep, action: Callable[[str, str, BootstrapConfig], Any]
) -> dict[str, Any]:
    _node_or_404(session, name)
    session.commit()
    with _remote_errors(name):
        action(settings.database_url, name, BootstrapConfig())
    session.expire_all()
    return node_public(_node_or_404(session, name))


@router.post("/{name}/bootstrap", response_model=NodePublic, responses={**_AUTH, **_404, **_424})
def post_bootstrap(name: str, session: SessionDep, settings: SettingsDep, _: AuthDep) -> dict[str, Any]:
    """Install the worker environment and join the Ray cluster (ABLATE_NODE_* settings)."""
    return _lifecycle(name, session, settings, bootstrap_node)


@router.post("/{name}/drain", response_model=NodePublic, responses={**_AUTH, **_404, **_424})
def post_drain(name: str, session: SessionDep, settings: SettingsDep, _: AuthDep) -> dict[str, Any]:
    """Leave the Ray cluster; the environment stays."""
    return _lifecycle(name, session, settings, drain_node)


@router.post("/{name}/teardown", response_model=NodePublic, responses={**_AUTH, **_404, **_424})
def post_teardown(name: str, session: SessionDep, settings: SettingsDep, _: AuthDep) -> dict[str, Any]:
    """Leave the Ray cluster and delete the node's working directory."""
    return _lifecycle(name, session, settings, teardown_node)
