"""Command arms: a grid arm that runs a researcher's own training command instead of ablate's trainer.

In a grid body it is {"name", "code", "command": [...], "env", "gpus", "stop_grace_s", "detector",
"description"}; it resolves to an ArmSpec whose `command` section holds what the node runs
(worker/command.py). The grid's overrides configure the built-in trainer, so a command arm takes none
of them except `detector`: the grid names the metric the detector judges, for every arm alike.
docs/your-trainer.md is the contract the command sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ValidationError

from model.spec import ArmSpec
from orchestrator.grids.arms import deep_merge

# The keys of a command arm in a grid body; the values after "command" go to ArmSpec.command.
ARM_KEYS = ("name", "description", "detector", "code", "command", "env", "gpus", "stop_grace_s", "term_grace_s")
# The built-in detector defaults are calibrated on LPIPS: a ceiling of 1.0 and LPIPS secondaries mean
# nothing for a loss the script names, so a command arm starts without them.
DETECTOR_DEFAULTS: dict[str, Any] = {"ceiling": None, "secondary": {}}
AUTO_METRIC_HINT = (
    "a command arm's detector judges a metric its script reports: name it in detector.metric (the grid's "
    "overrides or the arm's own, e.g. \"val_loss\"), or set detector.mode 'off'"
)


def is_command_arm(arm: Any) -> bool:
    return isinstance(arm, dict) and ("command" in arm or "code" in arm)


def _error(loc: Sequence[Any], msg: str, kind: str = "value_error") -> dict[str, Any]:
    return {"loc": list(loc), "msg": msg, "type": kind}


def _body_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """An ArmSpec error path back in the grid body's words (command.argv -> command, command.code -> code)."""
    if loc[:1] == ("command",) and len(loc) > 1:
        field, rest = loc[1], loc[2:]
        return ("command", *rest) if field == "argv" else (field, *rest)
    return loc


def resolve_command_arm(
    arm: dict[str, Any], position: int, overrides: dict[str, Any]
) -> tuple[ArmSpec | None, list[dict[str, Any]]]:
    """The arm's resolved spec, or None and its errors (each under ["arms", position, ...])."""
    prefix = ("arms", position)
    errors = [
        _error((*prefix, key), f"not a field of a command arm; its fields are {', '.join(ARM_KEYS)}", "extra_forbidden")
        for key in arm
        if key not in ARM_KEYS
    ]
    for key in ("code", "command"):
        if key not in arm:
            errors.append(_error((*prefix, key), "a command arm needs both code (a directory) and command (argv)",
                                 "missing"))
    if errors:
        return None, errors
    detector = deep_merge(deep_merge(DETECTOR_DEFAULTS, overrides.get("detector") or {}), arm.get("detector") or {})
    command = {"code": arm["code"], "argv": arm["command"]}
    command |= {k: arm[k] for k in ("env", "gpus", "stop_grace_s", "term_grace_s") if k in arm}
    raw = {"name": arm["name"], "description": arm.get("description", ""), "detector": detector, "command": command}
    try:
        spec = ArmSpec.model_validate(raw)
    except ValidationError as exc:
        return None, [
            _error((*prefix, *_body_loc(tuple(e["loc"]))), e["msg"], e["type"])
            for e in exc.errors(include_url=False, include_context=False, include_input=False)
        ]
    if spec.detector.mode != "off" and spec.detector.metric == "auto":
        return None, [_error((*prefix, "detector", "metric"), AUTO_METRIC_HINT)]
    return spec, []


def command_errors(
    resolved: Sequence[tuple[str, ArmSpec]], allowed: bool, command_dirs: Sequence[Path]
) -> list[dict[str, Any]]:
    """Command arms the operator has not allowed: commands off (ABLATE_ALLOW_COMMANDS), or `code`
    outside ABLATE_COMMAND_DIRS (lexical: the path is on the nodes). Judged on the resolved specs, so
    no other way of writing a spec slips past."""
    errors = []
    for i, (label, spec) in enumerate(resolved):
        if spec.command is None:
            continue
        if not allowed:
            errors.append(_error(("arms", i, "command"), f"arm {label}: command arms are off on this installation; "
                                 "the operator enables them with ABLATE_ALLOW_COMMANDS=1 (and ABLATE_COMMAND_DIRS)"))
            continue
        path = PurePosixPath(spec.command.code)
        if not path.is_absolute() or ".." in path.parts:
            errors.append(_error(("arms", i, "code"), f"arm {label}: {spec.command.code!r} must be an absolute "
                                 "directory without '..' under ABLATE_COMMAND_DIRS"))
        elif not any(path.is_relative_to(PurePosixPath(root)) for root in command_dirs):
            where = ", ".join(map(str, command_dirs)) if command_dirs else "none are configured"
            errors.append(_error(("arms", i, "code"), f"arm {label}: {spec.command.code!r} must lie under a "
                                 f"directory the operator allows in ABLATE_COMMAND_DIRS ({where})"))
    return errors
