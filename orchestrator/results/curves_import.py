"""Recorded curves as POST /api/grids/import and `ablate import` send them: a curves document (ablate's curves
JSON schema, as the CLI reads it from any of the formats it knows) with the new grid's name, its control, an
arm mapping and a detector policy. The controller stores it as a finished grid (orchestrator/results/importer.py)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy.exc import DataError
from sqlalchemy.orm import Session

from model.spec import DetectorPolicy
from orchestrator.db.models import Grid
from orchestrator.errors import InvalidBody
from orchestrator.grids.service import GRID_NAME_MAX
from orchestrator.messages import database_error_text
from orchestrator.results.curves import CurvesError, parse_curves
from orchestrator.results.importer import CurvesImportError, import_curves, start_times_of


class CurvesImport(BaseModel):
    """Curves to store as a finished grid, the collapse detector replayed over them."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=GRID_NAME_MAX, examples=["published study A-D"])
    # {curve key: {"label": str, "start_time": ISO time (optional), "checkpoints": [{"step": int, ...}]}}
    curves: dict[str, Any] = Field(min_length=1)
    control: str | None = None  # a curve key or arm letter; None: the first curve
    arms: dict[str, str] = {}  # curve key or label -> arm letter, for curves not named after their arm
    policy: DetectorPolicy | None = None  # one policy for every arm; None: each arm's spec's
    source: str = Field(default="", max_length=255)  # where the curves came from, named in each run's event


def import_body(session: Session, body: CurvesImport) -> Grid:
    """Store `body` as a finished grid; what cannot be imported is an InvalidBody naming its field (a 422).
    Flushes, no commit."""
    try:
        curves = parse_curves(body.curves, source="curves")
        return import_curves(session, curves, body.name, control=body.control, arm_map=body.arms,
                             policy=body.policy, source=body.source, start_times=start_times_of(body.curves))
    except CurvesError as exc:  # "curves: arm 'A', checkpoint 3 ...": the field named once, by its loc
        raise InvalidBody([{"loc": ["curves"], "msg": str(exc).removeprefix("curves: "), "type": "value_error"}]) \
            from None
    except CurvesImportError as exc:
        raise InvalidBody([{"loc": ["curves"], "msg": str(exc), "type": "value_error"}]) from None
    except (DataError, OverflowError) as exc:  # a number the database cannot hold (Postgres; SQLite's driver)
        text = database_error_text(exc) if isinstance(exc, DataError) else str(exc)
        raise InvalidBody([{"loc": ["curves"], "msg": f"a value the database cannot store: {text}",
                            "type": "value_error"}]) from None
    except ValidationError as exc:  # the grid record itself
        raise InvalidBody([{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]) from None
