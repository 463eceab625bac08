"""The base of every arm-spec section (model/spec.py, model/command_spec.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Base for every spec section: unknown keys and wrong types fail loudly."""

    # No inf/nan either: a spec is stored as strict JSON (Postgres rejects Infinity) and none needs them.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
