"""The kinds of domain error every service raises, so the API maps each kind to one status code
(orchestrator/api/errors.py) and the CLI prints any of them as one line."""

from __future__ import annotations

from typing import Any

from orchestrator.messages import errors_text


class NotFound(LookupError):
    """No such grid, run, node or schedule (HTTP 404)."""


class Conflict(ValueError):
    """The request does not fit the current state: a name taken, a run already finished (HTTP 409)."""


class InvalidBody(ValueError):
    """A request body that cannot be stored (HTTP 422). `errors` are pydantic-style dicts whose `loc`
    is relative to the body, e.g. ["arms", 1, "optimizer", "asymflow"]."""

    root = "(input)"  # the path shown for an error on the whole body

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        self.errors = errors
        super().__init__(self.message())

    def message(self) -> str:
        """One line: `arms.1.optimizer.asymflow: Extra inputs are not permitted; ...`."""
        return errors_text(self.errors, root=self.root)
