"""Every run of a grid trained here, on the CPU, and stored as the launcher would store it: for tests of what
comes after training (evaluations) that need real checkpoints and records without a launcher."""

from __future__ import annotations

from sqlalchemy import select

from model.spec import ArmSpec
from orchestrator.db.models import Run
from orchestrator.db.session import session_scope
from orchestrator.runs.ingest import ingest
from orchestrator.runs.placement import run_dir
from orchestrator.settings import Settings
from worker.train import train_arm


def train_grid_runs(settings: Settings, grid_id: int) -> None:
    """Train each run of the grid into its run folder, ingest its records (no detector) and mark it completed."""
    with session_scope(settings.database_url) as session:
        for run in session.scalars(select(Run).where(Run.grid_id == grid_id)):
            out = run_dir(settings, run.id)
            ingest(session, run, list(train_arm(ArmSpec.model_validate(run.spec), out)), detect=False)
            run.checkpoint_dir, run.state = str(out), "completed"
