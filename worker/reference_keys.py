"""What a distribution metric's reference features are keyed and pinned by, for both ends: the node finds its
features by `reference_key` (worker/references.py), the controller pins them by it (orchestrator/runs/
reference_pins.py). Torch-free, like the protocol that carries them (worker/protocol.py)."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated

from pydantic import Field

from model.spec import ArmSpec

MAX_REFERENCES = 16  # labels a record or a job names (a job: every label its metrics may carry, nine today)
ReferenceKey = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
ExtractorLabel = Annotated[str, Field(max_length=200)]  # a registry label (orchestrator/runs/ingest.py checks it)


def reference_key(label: str, spec: ArmSpec) -> str:
    """What a distribution metric's reference features depend on: the extractor (its label says stand-in) and
    the held-out split. Both ends compute it: the node to find the features, the controller to pin them
    (orchestrator/runs/reference_pins.py)."""
    # the split, not the training seed: seeds of a grid with one split_seed share one reference
    data = spec.data.model_dump(mode="json", exclude={"seed", "split_seed", "loader_workers", "max_unreadable"})
    ingredients = {"extractor": label, "data": data, "split": spec.data.dataset_seed(), "resolution": spec.resolution()}
    return hashlib.sha256(json.dumps(ingredients, sort_keys=True).encode()).hexdigest()[:32]
