"""The names of ablate's workers on a node's Ray, written once for both ends of the node protocol
(worker/protocol.py): a run's worker and an evaluation job's, each with its attempt, and the checks a name a
node sends must pass."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

WORKER_PREFIX = "ablate-run-"  # a run's worker on a node's Ray
EVALUATION_PREFIX = "ablate-eval-"  # an evaluation job's worker: one run's checkpoint evaluated again
WORKER_PREFIXES = (WORKER_PREFIX, EVALUATION_PREFIX)  # every worker of ablate's; the agent lists only these
_WORKER_NAME = re.compile(rf"^{WORKER_PREFIX}([0-9]{{1,18}})-([0-9]{{1,9}})$")
_EVALUATION_NAME = re.compile(rf"^{EVALUATION_PREFIX}([0-9]{{1,18}})-([0-9]{{1,9}})$")


def worker_name(run_id: int, attempt: int) -> str:
    """A run's worker on a node's Ray: a new attempt (after a worker died) gets a new name."""
    return f"{WORKER_PREFIX}{run_id}-{attempt}"


def parse_worker_name(name: str) -> tuple[int, int] | None:
    """(run id, attempt) of a worker name; None for a name that is not one (a node may name anything)."""
    found = _WORKER_NAME.match(name)
    return (int(found[1]), int(found[2])) if found else None


def evaluation_worker_name(job_id: int, attempt: int) -> str:
    """An evaluation job's worker (orchestrator/runs/evaluation_jobs.py): a new attempt gets a new name."""
    return f"{EVALUATION_PREFIX}{job_id}-{attempt}"


def parse_evaluation_name(name: str) -> tuple[int, int] | None:
    """(evaluation job id, attempt) of an evaluation worker's name; None for any other name."""
    found = _EVALUATION_NAME.match(name)
    return (int(found[1]), int(found[2])) if found else None


def _is_worker_name(name: str) -> str:
    if parse_worker_name(name) is None and parse_evaluation_name(name) is None:
        raise ValueError(f"not a worker name ({WORKER_PREFIX}<run id>-<attempt> or "
                         f"{EVALUATION_PREFIX}<job id>-<attempt>)")
    return name


WorkerName = Annotated[str, Field(max_length=64), AfterValidator(_is_worker_name)]
# Any name a node lists in its hello: checked against placements (orchestrator/runs/placement.py not_placed).
ListedName = Annotated[str, Field(max_length=200, pattern=r"^[A-Za-z0-9._-]+$")]
