"""The reference features of the distribution metrics on a node: in this process, on the node's disk, in the
checkpoint store, each copy checked by the sha256 of its bytes.

A copy's sha256 saved in the same file proves only that the file is whole: anyone who can write the file can
write both. What proves the features are the right ones is the controller's pin (orchestrator/runs/
reference_pins.py: the sha256 of the first features a trusted node reported for the key), which an evaluation
job carries. So:
- the store's copy (`<store root>/references/<key>.pt`, writable by every node that runs a distribution pass) is
  read only under a pin and used only when its features hash to it; without a pin this node computes its own;
- the node's own copy (features it computed, or a store copy that matched a pin) is used unless it fails the pin;
- features computed here that differ from the pin are used and reported with their own sha256 (the controller
  refuses the record: it names other features), and are never published over the store's copy.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REFERENCES = "references"


def features_sha(features: torch.Tensor) -> str:
    return hashlib.sha256(features.contiguous().numpy().tobytes()).hexdigest()


class ReferenceCache:
    """Reference features by key, checked against the controller's pins where it gave any."""

    def __init__(self, node_dir: Path, store: dict[str, Any] | None = None,
                 pins: dict[str, str] | None = None) -> None:  # fmt: skip
        self.local = node_dir / REFERENCES
        self.store = store  # {"url": the store root, "options": fsspec options} or None
        self.pins = dict(pins or {})  # key -> sha256 of the features the controller pinned
        self.memory: dict[str, tuple[torch.Tensor, str]] = {}
        self.notes: list[str] = []  # a refused or unreachable copy: said on the record

    def _read(self, path: Path, key: str) -> tuple[torch.Tensor, str] | None:
        """The features at `path` when they are whole (their own sha256) and, under a pin, the pinned ones."""
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
        except (OSError, RuntimeError, EOFError) as exc:
            self.notes.append(f"reference {key} unreadable at {path} ({type(exc).__name__}): computed again")
            return None
        features = saved.get("features") if isinstance(saved, dict) else None
        if not isinstance(features, torch.Tensor) or (sha := features_sha(features)) != saved.get("sha256"):
            self.notes.append(f"reference {key} at {path} fails its sha256: computed again")
            return None
        if (pin := self.pins.get(key)) is not None and sha != pin:
            self.notes.append(f"reference {key} at {path} is not the features the controller pinned "
                              f"(sha256 {sha[:16]}, pinned {pin[:16]}): not used")  # fmt: skip
            return None
        return features, sha

    def _store_fs(self) -> tuple[Any, str] | None:
        if not self.store:
            return None
        from worker.checkpoint_store import open_fs

        return open_fs(self.store["url"], self.store.get("options"))

    def _from_store(self, key: str, path: Path) -> tuple[torch.Tensor, str] | None:
        """The store's copy where the controller pinned the key and the copy is the pinned features; it then
        becomes this node's copy. Fetched beside, never over, the node's own until it passed."""
        if not self.store or key not in self.pins:
            return None
        part = path.with_suffix(f".{time.monotonic_ns()}.fetched")
        try:
            fs, root = self._store_fs()  # type: ignore[misc]
            if not fs.exists(f"{root}/{REFERENCES}/{key}.pt"):
                return None
            self.local.mkdir(parents=True, exist_ok=True)
            fs.get(f"{root}/{REFERENCES}/{key}.pt", str(part))
            found = self._read(part, key)
            if found is not None:
                part.replace(path)
            return found
        except OSError as exc:
            self.notes.append(f"reference store unreachable ({exc}): computed on this node")
            return None
        finally:
            part.unlink(missing_ok=True)

    def get(self, key: str, compute: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, str, str]:
        """(features, sha256, where from: memory | node | store | computed)."""
        if key in self.memory:
            return (*self.memory[key], "memory")
        path = self.local / f"{key}.pt"
        found, where = (self._read(path, key), "node") if path.is_file() else (None, "")
        if found is None and (found := self._from_store(key, path)) is not None:
            where = "store"
        if found is None:
            features = compute().float().cpu().contiguous()
            found, where = (features, features_sha(features)), "computed"
            pin = self.pins.get(key)
            if pin is not None and found[1] != pin:
                self.notes.append(f"reference {key} computed on this node is not the features the controller "
                                  f"pinned (sha256 {found[1][:16]}, pinned {pin[:16]})")  # fmt: skip
            self._write(path, key, *found, publish=pin is None or found[1] == pin)
        self.memory[key] = found
        return (*found, where)

    def _write(self, path: Path, key: str, features: torch.Tensor, sha: str, *, publish: bool) -> None:
        self.local.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{time.monotonic_ns()}.part")  # runs on one node may write it at once
        torch.save({"features": features, "sha256": sha}, tmp)
        tmp.replace(path)
        if not publish:
            return
        try:
            if (opened := self._store_fs()) is not None:
                fs, root = opened
                fs.makedirs(f"{root}/{REFERENCES}", exist_ok=True)
                fs.put(str(path), f"{root}/{REFERENCES}/{key}.pt")
        except OSError as exc:
            self.notes.append(f"reference {key} not stored in the checkpoint store ({exc}): kept on this node")
