"""The reference_pins table (orchestrator/runs/reference_pins.py), on models.py's Base; migrations/env.py imports
it so the metadata the migrations are checked against holds it."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from orchestrator.db.models import Base, utcnow


class ReferencePin(Base):
    """The reference features of a distribution metric's key (worker/reference_keys.py: the extractor's
    label and the held-out split), pinned by their sha256 at the first record a trusted node sent for the key
    (orchestrator/runs/reference_pins.py). Every later record for the key must name them, and every evaluation
    job is sent the pin. Kept past its grid: another grid on the same split scores against the same features."""

    __tablename__ = "reference_pins"

    key: Mapped[str] = mapped_column(String(32), primary_key=True)
    label: Mapped[str] = mapped_column(String(200))  # the extractor's label, for the operator
    sha256: Mapped[str] = mapped_column(String(64))
    node: Mapped[str] = mapped_column(String(200))  # the trusted node whose record pinned it
    run_id: Mapped[int | None] = mapped_column(Integer)  # that record's run (no foreign key: the pin outlives it)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
