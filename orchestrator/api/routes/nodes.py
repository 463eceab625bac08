"""Nodes: rented GPU machines reached over SSH. Register, declare (GPUs, trust), list, probe, bootstrap, drain,
tear down, remove.

SSH work runs in the request (FastAPI's thread pool); a node that cannot be reached or whose host key
is refused answers 424 with the reason (fingerprint and how to trust it included). Errors are mapped
in orchestrator/api/errors.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Response, status

from orchestrator.api.schemas import NodeCreate, NodePublic, NodeUpdate, ProbeResult
from orchestrator.fleet.bootstrap import BootstrapConfig, bootstrap_node, drain_node, teardown_node
from orchestrator.fleet.errors import remote_errors
from orchestrator.fleet.inventory import add_node, get_node, list_nodes, remove_node, update_node
from orchestrator.fleet.probe import probe_node
from orchestrator.web.deps import AUTH_RESPONSES, AuthDep, SessionDep, SettingsDep

router = APIRouter(prefix="/api/nodes", tags=["nodes"])

_404 = {404: {"description": "no such node"}}
_424 = {424: {"description": "the node could not be reached, refused its host key, or a command failed"}}


@router.get("", response_model=list[NodePublic], responses=AUTH_RESPONSES)
def get_nodes(session: SessionDep, _: AuthDep) -> list[NodePublic]:
    return [NodePublic.model_validate(n) for n in list_nodes(session)]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=NodePublic,
    responses={**AUTH_RESPONSES, 409: {"description": "name taken"}},
)
def post_node(body: NodeCreate, session: SessionDep, settings: SettingsDep, _: AuthDep) -> NodePublic:
    """Register a node. Its host key must already be in the known-hosts file (`ssh-keyscan`); its key
    and known-hosts files must lie under ABLATE_SSH_KEY_DIRS on the controller. `gpus` is required: the
    node uses the lower of it and its probe."""
    return NodePublic.model_validate(add_node(session, body, key_dirs=settings.ssh_key_dirs))


@router.get("/{name}", response_model=NodePublic, responses={**AUTH_RESPONSES, **_404})
def get_node_by_name(name: str, session: SessionDep, _: AuthDep) -> NodePublic:
    return NodePublic.model_validate(get_node(session, name))


@router.patch("/{name}", response_model=NodePublic, responses={**AUTH_RESPONSES, **_404})
def patch_node(name: str, body: NodeUpdate, session: SessionDep, _: AuthDep) -> NodePublic:
    """Declare the node's GPUs (it uses the lower of these and its probe) or whether its values are
    trusted to stop arms on other nodes."""
    return NodePublic.model_validate(update_node(session, name, body))


@router.delete(
    "/{name}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses={**AUTH_RESPONSES, **_404, 409: {"description": "a schedule uses it"}},
)
def delete_node(name: str, session: SessionDep, _: AuthDep) -> Response:
    """Forget the node (the machine itself is not touched)."""
    remove_node(session, name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{name}/probe", response_model=ProbeResult, responses={**AUTH_RESPONSES, **_404, **_424})
def post_probe(name: str, session: SessionDep, settings: SettingsDep, _: AuthDep) -> ProbeResult:
    """GPUs from nvidia-smi, free disk (GB) and Python version, over SSH; stored on the node."""
    get_node(session, name)
    session.commit()  # the probe records each command through its own sessions, as it runs
    with remote_errors(name):
        return ProbeResult.model_validate(probe_node(settings.database_url, name))


def _lifecycle(
    name: str, session: SessionDep, settings: SettingsDep, action: Callable[[str, str, BootstrapConfig], Any]
) -> NodePublic:
    get_node(session, name)
    session.commit()  # the action records each command through its own sessions, as it runs
    with remote_errors(name):
        action(settings.database_url, name, BootstrapConfig())
    session.expire_all()
    return NodePublic.model_validate(get_node(session, name))


@router.post("/{name}/bootstrap", response_model=NodePublic, responses={**AUTH_RESPONSES, **_404, **_424})
def post_bootstrap(name: str, session: SessionDep, settings: SettingsDep, _: AuthDep) -> NodePublic:
    """Install the worker environment and start the node's own Ray (ABLATE_NODE_* settings)."""
    return _lifecycle(name, session, settings, bootstrap_node)


@router.post("/{name}/drain", response_model=NodePublic, responses={**AUTH_RESPONSES, **_404, **_424})
def post_drain(name: str, session: SessionDep, settings: SettingsDep, _: AuthDep) -> NodePublic:
    """Stop the node's own Ray (its arms are re-queued elsewhere); the environment stays."""
    return _lifecycle(name, session, settings, drain_node)


@router.post("/{name}/teardown", response_model=NodePublic, responses={**AUTH_RESPONSES, **_404, **_424})
def post_teardown(name: str, session: SessionDep, settings: SettingsDep, _: AuthDep) -> NodePublic:
    """Stop the node's own Ray and delete the node's working directory."""
    return _lifecycle(name, session, settings, teardown_node)
