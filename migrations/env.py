"""Alembic environment: the URL comes from the config built in orchestrator.db.session, else the settings."""

from alembic import context
from sqlalchemy import engine_from_config, pool

from orchestrator.db import reference_pin  # noqa: F401 - its table, in Base.metadata
from orchestrator.db.models import Base
from orchestrator.settings import load_settings

config = context.config
url = config.get_main_option("sqlalchemy.url") or load_settings().database_url
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = engine_from_config({"sqlalchemy.url": url}, prefix="sqlalchemy.", poolclass=pool.NullPool)
    with connectable.connect() as connection:
        # Batch mode lets ALTERs work on SQLite (copy-and-move) as well as Postgres.
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
