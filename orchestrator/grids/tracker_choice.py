"""Which client each tracker needs, and a grid's tracker list checked against what is installed.

The clients are optional extras (`pip install 'ablate-dit[wandb]'`): a tracker whose package is missing is
refused when a grid names it (HTTP 422 naming the extra), never found missing while a run trains.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

from orchestrator.vocabulary import TrackerName

# The package each tracker's extra installs (TensorBoard's writer is torch's SummaryWriter, which needs it).
CLIENT_PACKAGES = {TrackerName.wandb: "wandb", TrackerName.tensorboard: "tensorboard", TrackerName.mlflow: "mlflow"}


def missing_client(name: TrackerName) -> str | None:
    """Why `name` cannot be used on this controller (its extra to install), or None when it can."""
    if importlib.util.find_spec(CLIENT_PACKAGES[name]) is None:
        return f"the {name} tracker needs its client on the controller: pip install 'ablate-dit[{name}]'"
    return None


def tracker_errors(named: Sequence[TrackerName] | None, default: Sequence[TrackerName]) -> list[dict[str, Any]]:
    """A grid body's tracker problems as 422 error entries: twice-named trackers and missing clients.

    `named`: the body's `trackers` (None: it names none, so the installation's `default`, ABLATE_TRACKERS,
    applies and a problem there is reported against that variable).
    """
    errors: list[dict[str, Any]] = []
    for i, name in enumerate(named if named is not None else default):
        loc = ["trackers", i] if named is not None else ["trackers"]
        why = missing_client(name)
        if named is not None and name in named[:i]:
            why = f"{name} is named twice"
        elif why is not None and named is None:
            why = f"ABLATE_TRACKERS names {name}, but {why}"
        if why is not None:
            errors.append({"loc": loc, "msg": why, "type": "value_error"})
    return errors


def grid_trackers(named: Sequence[TrackerName] | None, default: Sequence[TrackerName]) -> list[str]:
    """The trackers a new grid forwards to: its own list, else the installation's."""
    return [str(name) for name in (named if named is not None else default)]
