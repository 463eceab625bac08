"""Arms A..I from arms/*.yaml, resolved, with what each changes against its parent."""

from __future__ import annotations

from fastapi import APIRouter

from orchestrator.api.schemas import ArmPublic
from orchestrator.grids.arms import all_arms, lineage_table

router = APIRouter(prefix="/api/arms", tags=["arms"])


@router.get("", response_model=list[ArmPublic])
def list_arms() -> list[ArmPublic]:
    specs = all_arms()
    return [ArmPublic(**row, spec=specs[row["arm"]].model_dump(mode="json")) for row in lineage_table()]
