"""Alembic is the only way the schema changes: up, down to base, up again, and no drift from the models."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, text

from orchestrator.db import reference_pin  # noqa: F401 - its table, in Base.metadata as in migrations/env.py
from orchestrator.db.models import Base
from orchestrator.db.session import alembic_config, upgrade

TABLES = {"grids", "runs", "metrics", "events", "nodes", "schedules"}


def tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def drift(url: str) -> list:
    """What `alembic check` compares: the migrated schema against the models (types included)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
            return compare_metadata(ctx, Base.metadata)
    finally:
        engine.dispose()


def test_one_head() -> None:
    assert len(ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads()) == 1


def test_up_down_up_without_drift(empty_database_url: str) -> None:
    url = empty_database_url
    cfg = alembic_config(url)

    upgrade(url)
    assert TABLES <= tables(url)
    assert drift(url) == []

    command.downgrade(cfg, "base")
    assert tables(url) == set()

    upgrade(url)
    assert TABLES <= tables(url)
    assert drift(url) == []


def test_every_revision_steps_down_and_up(empty_database_url: str) -> None:
    # One revision at a time, so a later revision's downgrade is exercised on its own too.
    url = empty_database_url
    cfg = alembic_config(url)
    upgrade(url)
    revisions = list(ScriptDirectory.from_config(cfg).walk_revisions())
    for _ in revisions:
        command.downgrade(cfg, "-1")
    assert tables(url) == set()
    for _ in revisions:
        command.upgrade(cfg, "+1")
    assert drift(url) == []


def test_an_installation_that_rented_under_the_old_default_id_keeps_it(tmp_path: Path) -> None:
    from orchestrator.fleet.providers.identity import stored_controller_id

    old, fresh = f"sqlite:///{tmp_path / 'old.db'}", f"sqlite:///{tmp_path / 'fresh.db'}"
    upgrade(old, "0005")  # rented before the id was generated: every label said ablate.ablate.s<sweep>
    engine = create_engine(old)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO rented_instances (provider, instance_id, gpu_name, gpus, price_per_hour, label, state,"
                " created_at) VALUES ('vast', '7001', 'RTX 4090', 4, 1.2, 'ablate.ablate.s3', 'running', '2026-01-01')"
            )
        )
    engine.dispose()
    upgrade(old)
    upgrade(fresh)
    assert stored_controller_id(old) == "ablate"  # its reaper still knows what it labelled before
    generated = stored_controller_id(fresh)
    assert generated.startswith("ablate-") and generated != "ablate" and stored_controller_id(fresh) == generated
