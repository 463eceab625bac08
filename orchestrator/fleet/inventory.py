"""The node inventory in the database: register, look up, list and remove the machines the operator
(or a provider) hands the controller. Nothing here touches a machine."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.db.models import Node, Schedule
from orchestrator.fleet.errors import NodeConflict, NodeInvalid, NodeNotFound
from orchestrator.vocabulary import LOCAL_NODE, NodeState

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"  # node and schedule names
LOCAL = LOCAL_NODE  # the controller's own machine, as a node name (no registered node may take it)
MAX_NODE_GPUS = 1024
Named = TypeVar("Named", Node, Schedule)


class NodeCreate(BaseModel):
    """A node as POST /api/nodes and `ablate nodes add` take it. Paths are on the controller machine."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN, examples=["quad-4090-a"])
    host: str = Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9.:\[\]_-]+$", examples=["203.0.113.7"])
    port: int = Field(default=22, ge=1, le=65535)
    user: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._][A-Za-z0-9._-]*$", examples=["ubuntu"])
    key_path: str = Field(min_length=1, max_length=4096, examples=["~/.ssh/id_ed25519"])
    # None: the controller user's ~/.ssh/known_hosts.
    known_hosts_path: str | None = Field(default=None, min_length=1, max_length=4096)
    # What the provider charges per hour for the whole node; the sweep budget sums these.
    price_per_hour: float = Field(default=0.0, ge=0, le=1e6)
    # The GPUs the operator says the node has. Its probe (the node's own nvidia-smi) is its word; the node
    # uses the lower of the two, so a probe listing more draws no more arms.
    gpus: int = Field(ge=1, le=MAX_NODE_GPUS, description="GPUs the node has, as the operator knows it")
    # Its values may stop arms on other nodes (the stall rule against a control it runs): docs/security.md.
    trusted: bool = False

    @field_validator("name")
    @classmethod
    def _not_local(cls, v: str) -> str:
        if v == LOCAL:
            raise ValueError(f"{LOCAL!r} is the controller's own machine; pick another name")
        return v

    @field_validator("key_path", "known_hosts_path")
    @classmethod
    def _usable_path(cls, v: str | None) -> str | None:
        # Only the syntax here: where the file may lie and whether it exists is `check_key_paths`, which
        # the API runs against the operator's allowed directories (no file-existence oracle elsewhere).
        if v is None:
            return v
        if "\x00" in v:
            raise ValueError("must not contain NUL characters")
        try:
            return str(Path(v).expanduser().resolve())
        except (OSError, RuntimeError) as exc:  # name too long, ~unknownuser, ...
            raise ValueError(f"not a usable file path: {exc}") from None


class NodeUpdate(BaseModel):
    """What PATCH /api/nodes/{name} and `ablate nodes set` change: the operator's word on a node."""

    model_config = ConfigDict(extra="forbid")

    gpus: int | None = Field(default=None, ge=1, le=MAX_NODE_GPUS)
    trusted: bool | None = None


def key_path_problems(body: NodeCreate, allowed_dirs: Sequence[Path]) -> dict[str, str]:
    """Field -> what is wrong, for key_path / known_hosts_path: each must be an existing file under one
    of `allowed_dirs` (ABLATE_SSH_KEY_DIRS). A path outside them is refused without looking at it, so
    the answer tells a client nothing about files elsewhere on the controller."""
    roots = [d.expanduser().resolve() for d in allowed_dirs]
    problems: dict[str, str] = {}
    for name in ("key_path", "known_hosts_path"):
        value = getattr(body, name)
        if value is None:
            continue
        path = Path(value)  # already expanded and resolved (symbolic links followed) by the validator
        if not any(path.is_relative_to(root) for root in roots):
            where = ", ".join(map(str, roots)) or "(none configured)"
            problems[name] = f"must be a file under the allowed SSH key directories (ABLATE_SSH_KEY_DIRS): {where}"
        elif not path.is_file():
            problems[name] = f"no such file on the controller: {path}"
    return problems


def add_node(session: Session, body: NodeCreate, key_dirs: Sequence[Path] | None = None) -> Node:
    """Register a node; NodeConflict if the name is taken. With `key_dirs` (ABLATE_SSH_KEY_DIRS), its
    key files must lie under them (NodeInvalid naming the field otherwise). Flushes, no commit."""
    problems = key_path_problems(body, key_dirs) if key_dirs is not None else {}
    if problems:
        raise NodeInvalid([{"loc": [field], "msg": msg, "type": "value_error"} for field, msg in problems.items()])
    if find_node(session, body.name) is not None:
        raise NodeConflict(f"a node named {body.name!r} already exists; remove it first or pick another name")
    node = Node(**body.model_dump(exclude={"gpus"}), declared_gpus=body.gpus)
    session.add(node)
    session.flush()
    return node


def update_node(session: Session, name: str, body: NodeUpdate) -> Node:
    """Set what the operator declares of a node (its GPU count, whether its values are trusted). Flushes."""
    node = get_node(session, name)
    if body.gpus is not None:
        node.declared_gpus = body.gpus
    if body.trusted is not None:
        node.trusted = body.trusted
    session.flush()
    return node


def find_named(session: Session, model: type[Named], name: str) -> Named | None:
    """The node or schedule called `name`, or None."""
    if not re.match(NAME_PATTERN, name):
        return None  # cannot exist; also keeps NUL bytes and the like away from the database
    return session.scalar(select(model).where(model.name == name))  # type: ignore[attr-defined]


def find_node(session: Session, name: str) -> Node | None:
    return find_named(session, Node, name)


def get_node(session: Session, name: str) -> Node:
    node = find_node(session, name)
    if node is None:
        raise NodeNotFound(f"no node named {name!r}; `ablate nodes list` shows the registered ones")
    return node


def list_nodes(session: Session) -> list[Node]:
    return list(session.scalars(select(Node).order_by(Node.name)))


def set_state(node: Node, state: NodeState, detail: str | None = None) -> None:
    """Move a node to `state`. A failed bootstrap stays visible through the drain or teardown that follows
    it (the operator must see why); only the next bootstrap clears it."""
    if node.state == NodeState.bootstrap_failed and state in (NodeState.registered, NodeState.drained):
        return
    node.state, node.state_detail = state, detail


def state_text(state: str, detail: str | None) -> str:
    """A node's state as a person reads it: `bootstrap_failed (join: exit 126)`."""
    return f"{state} ({detail})" if detail else state


def remove_node(session: Session, name: str) -> None:
    """Forget a node; refused while a schedule still names it. The machine itself is not touched."""
    node = get_node(session, name)
    users = [s.name for s in session.scalars(select(Schedule)) if name in s.nodes]
    if users:
        raise NodeConflict(f"node {name!r} is used by schedule(s) {', '.join(users)}; change or delete those first")
    session.delete(node)
    session.flush()
