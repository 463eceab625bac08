"""The reference features each distribution metric is scored against, pinned by the controller.

A distribution value (CMMD, DINO-MMD, FD-DINOv2) compares generated samples with the features of the held-out
images. Nodes share those features through `<store root>/references/<key>.pt`, which every node running a
distribution pass may write, so the file's own sha256 proves nothing: a stranger could rewrite it and every
node reading it would score against the stranger's features. The controller therefore pins them:

- the first record a trusted node (runs/trust.py trusted_nodes) sends for a key (worker/protocol.py
  reference_key: the extractor's label and the held-out split, computed here from the run's own spec, never
  taken from the node) pins the sha256 it names in `distribution_sha256`;
- every record naming other features for a pinned key is refused, nothing stored (`refused_references`), and
  a record carrying a distribution value without naming its features is refused too;
- every evaluation job is sent the pins of the labels it may use (`pins_for`), and its node scores only
  against features that hash to them (worker/references.py).
A stranger's record never pins: before a trusted node's, a key's records are each node's own word, as every
value it reports is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy.orm import Session

from model.extractors.registry import EXTRACTOR_FOR_METRIC, FINAL_EXTRACTOR_FOR_METRIC, labels_for_metric
from model.spec import ArmSpec
from orchestrator.db.models import Run
from orchestrator.db.reference_pin import ReferencePin
from orchestrator.db.session import session_scope
from orchestrator.runs.checkpoint import EXTRACTOR_SUFFIX
from orchestrator.runs.trust import trusted_nodes
from worker.reference_keys import reference_key

SHAS = "distribution_sha256"  # the record's field: extractor label -> sha256 of the features it scored against


def _spec(run: Run) -> ArmSpec | None:
    try:
        return ArmSpec.model_validate(run.spec or {})
    except ValueError:  # a command arm, or a stored spec this version no longer reads: no reference of ours
        return None


def names_references(records: Iterable[dict[str, Any]]) -> bool:
    """Whether any record carries a distribution value's label or reference (only those need the database)."""
    return any(SHAS in r or any(k.endswith(EXTRACTOR_SUFFIX) for k in r) for r in records)


def refused_references(session: Session, run: Run, node: str, records: Iterable[dict[str, Any]],
                       trusted: set[str]) -> str | None:  # fmt: skip
    """Why `records` (from `node`, for `run`; protocol- and range-checked) name reference features other than
    the pinned ones, or None; pins the features a trusted node's record names where the key has no pin yet
    (in the caller's transaction). `trusted`: trust.trusted_nodes()."""
    spec = None
    for record in records:
        shas = record.get(SHAS) or {}
        labels = {key: label for key, label in record.items() if key.endswith(EXTRACTOR_SUFFIX) and label is not None}
        for key, label in labels.items():
            if label not in shas:
                return (f"a record of step {record.get('step')} with {key} but no {SHAS} for its label: every "
                        f"distribution value names the reference features it was scored against")
        for label, sha in shas.items():
            if spec is None and (spec := _spec(run)) is None:
                return f"a record of step {record.get('step')} with {SHAS}, but the run's spec has no held-out split"
            key = reference_key(label, spec)
            pin = session.get(ReferencePin, key)
            if pin is None and node in trusted:
                session.add(ReferencePin(key=key, label=label, sha256=sha, node=node, run_id=run.id))
            elif pin is not None and pin.sha256 != sha:
                return (f"a record of step {record.get('step')} whose {label!r} reference features (sha256 "
                        f"{sha[:16]}) are not the ones the controller pinned (sha256 {pin.sha256[:16]}, from node "
                        f"{pin.node}): a node's copy of the reference was not the pinned one")
    return None


def checked_references(database_url: str, run_id: int, node: str, records: list[dict[str, Any]]) -> str | None:
    """refused_references for a training run's records, in a transaction of its own (the launcher's): the pins
    a reply names are committed, unless the reply is refused."""
    if not names_references(records):
        return None
    with session_scope(database_url) as session:
        run = session.get(Run, run_id)
        refused = None if run is None else refused_references(session, run, node, records, trusted_nodes(session))
        if refused is not None:
            session.rollback()  # a refused reply pins nothing
        return refused


def pins_for(session: Session, spec: ArmSpec, metrics: Iterable[str]) -> dict[str, str]:
    """key -> pinned sha256 for every label an evaluation of `metrics` on `spec` may score with (each metric's
    extractor during training and in a final evaluation, real or stand-in): the job's reference_pins."""
    labels = {label for m in metrics if m in EXTRACTOR_FOR_METRIC or m in FINAL_EXTRACTOR_FOR_METRIC
              for label in labels_for_metric(m)}  # fmt: skip
    keys = {reference_key(label, spec) for label in labels}
    return {pin.key: pin.sha256 for key in sorted(keys) if (pin := session.get(ReferencePin, key)) is not None}
