"""The node protocol: what a node's agent and the controller say to each other, written once for both ends.

A node is a stranger: everything it sends is a claim the controller checks against these models before it
acts on it (fleet/agent_link.py reads replies through them; worker/agent.py and the worker write them).
Torch-free and Ray-free: a controller imports it without either.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

StorageKind = Literal[
    "checkpoint.stored",
    "checkpoint.store_failed",
    "checkpoint.store_abandoned",
    "checkpoint.fetched",
    "checkpoint.fetch_failed",
]
STORAGE_EVENTS: tuple[str, ...] = get_args(StorageKind)
# Events after which storage holds a step (data["step"]).
HELD_EVENTS = ("checkpoint.stored", "checkpoint.fetched")
# Upload-log entries one poll may carry: the worker keeps its last 50 (worker/checkpoint_store.py LOG_KEEP).
STORAGE_LOG_MAX = 64

_Step = Annotated[int, Field(ge=0, le=2**31 - 1)]
_Short = Annotated[str, Field(max_length=64)]
_Long = Annotated[str, Field(max_length=4000)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StorageData(_Strict):
    """What an upload-log entry may say besides its kind (worker/checkpoint_store.py `_note`): nothing else."""

    step: _Step | None = None
    best_step: _Step | None = None
    bytes: Annotated[int, Field(ge=0, le=2**53)] | None = None
    seconds: Annotated[float, Field(ge=0, le=1e9)] | None = None
    url: _Long | None = None
    attempt: Annotated[int, Field(ge=0, le=2**31)] | None = None
    retry_in_s: Annotated[float, Field(ge=0, le=1e9)] | None = None
    error: _Long | None = None


class StorageEntry(_Strict):
    seq: Annotated[int, Field(ge=1, le=2**53)]
    time: _Short | None = None
    kind: StorageKind  # one of the storage events: never `started`, `rented.*` or any other kind
    message: _Long = ""
    data: StorageData = StorageData()


class StorageStatus(_Strict):
    """A worker's storage status in its poll reply (worker/checkpoint_store.py CheckpointStore.status)."""

    url: _Long | None = None
    stored_step: _Step | None = None
    stored_at: _Short | None = None
    failures: Annotated[int, Field(ge=0, le=2**31)] = 0
    failing_since: _Short | None = None
    last_error: _Long | None = None
    pending_step: _Step | None = None
    log: Annotated[list[StorageEntry], Field(max_length=STORAGE_LOG_MAX)] = []
