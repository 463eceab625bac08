"""Arm files: load `arms/*.yaml`, resolve parents by deep merge, validate, and diff against the parent."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

from arms import ARMS_DIR
from model.spec import ArmSpec
from orchestrator.messages import yaml_error_text

LINEAGE_KEYS = ("name", "parent", "description")


class ArmError(ValueError):
    """An arm that cannot be resolved: unknown parent, cycle, unreadable file, or invalid fields."""


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """A copy of `base` with `over` merged in; nested dicts merge key by key, everything else replaces."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


@cache
def arm_files(arms_dir: Path = ARMS_DIR) -> dict[str, dict[str, Any]]:
    """Raw arm dicts by letter, as written in the files (parent + changed fields only)."""
    raw: dict[str, dict[str, Any]] = {}
    for path in sorted(arms_dir.glob("[A-Z].yaml")):
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ArmError(f"{path}: not valid YAML: {yaml_error_text(exc)}") from exc
        if not isinstance(data, dict):
            raise ArmError(f"{path}: must hold a mapping of spec sections")
        raw[path.stem] = data
    return raw


def resolve_raw(spec: dict[str, Any], known: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Merge a raw spec over its parent chain (nearest parent last), returning the flat raw dict."""
    known = arm_files() if known is None else known
    chain = [spec]
    seen: set[str] = set()
    parent = spec.get("parent")
    while parent is not None:
        if not isinstance(parent, str):
            raise ArmError(f"parent must be an arm letter such as 'A', not {parent!r}")
        if parent in seen:
            raise ArmError(f"parent cycle through arm {parent!r}")
        if parent not in known:
            raise ArmError(f"unknown parent arm {parent!r}; known arms: {', '.join(sorted(known))}")
        seen.add(parent)
        chain.append(known[parent])
        parent = known[parent].get("parent")
    merged: dict[str, Any] = {}
    for layer in reversed(chain):
        merged = deep_merge(merged, layer)
    # Lineage belongs to the spec itself, not to whatever ancestor set it last.
    for key in LINEAGE_KEYS:
        merged.pop(key, None)
        if key in spec:
            merged[key] = spec[key]
    return merged


def resolve(spec: dict[str, Any] | str, overrides: dict[str, Any] | None = None) -> ArmSpec:
    """An arm letter or an inline raw spec, resolved through its parents, with overrides on top.

    An inline spec's own fields win over the overrides: they are the change the arm exists to test,
    written in the same grid as the overrides, and an arm's change silently replaced by a grid-wide
    value would be lost the way the source study lost its AsymFlow arm. An arm file's fields are the
    study's settings, which overrides adapt (e.g. A's 500-step warm-up in a 400-step tiny grid).

    Raises pydantic's ValidationError for invalid fields (the API turns it into a 422 naming the path).
    """
    own: dict[str, Any] = {}
    if isinstance(spec, str):
        files = arm_files()
        if spec not in files:
            raise ArmError(f"unknown arm {spec!r}; known arms: {', '.join(sorted(files))}")
        raw = dict(files[spec])
        raw.setdefault("name", spec)
    else:
        raw = spec
        own = {k: v for k, v in spec.items() if k not in LINEAGE_KEYS}
    merged = resolve_raw(raw)
    if overrides:
        merged = deep_merge(deep_merge(merged, overrides), own)
    return ArmSpec.model_validate(merged)


def all_arms() -> dict[str, ArmSpec]:
    """Every arm in arms/, resolved."""
    return {letter: resolve(letter) for letter in arm_files()}


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def changes(arm: ArmSpec, parent: ArmSpec | None) -> dict[str, Any]:
    """Dotted field -> value for every field where `arm` differs from `parent` (lineage excluded)."""
    mine = flatten(arm.model_dump(mode="json", exclude=set(LINEAGE_KEYS)))
    if parent is None:
        return {}
    theirs = flatten(parent.model_dump(mode="json", exclude=set(LINEAGE_KEYS)))
    return {k: v for k, v in mine.items() if theirs.get(k) != v}


def lineage_table() -> list[dict[str, Any]]:
    """One row per arm: letter, parent, description, and what it changes against its parent."""
    arms = all_arms()
    return [
        {
            "arm": letter,
            "parent": spec.parent,
            "description": spec.description,
            "changes": changes(spec, arms.get(spec.parent) if spec.parent else None),
        }
        for letter, spec in arms.items()
    ]
