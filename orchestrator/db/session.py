"""Engine and sessions, and the Alembic upgrade that creates or changes the schema."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

import migrations

MIGRATIONS_DIR = Path(migrations.__file__).parent
# Seconds a new Postgres connection keeps retrying while the server refuses it (restarting).
CONNECT_WAIT_S = 5.0


def alembic_config(database_url: str) -> Config:
    """Alembic config built in code, so an installed package finds its migrations anywhere."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


def upgrade(database_url: str, revision: str = "head") -> None:
    if database_url.startswith("sqlite:///"):
        Path(database_url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(database_url), revision)


@cache
def engine_for(database_url: str) -> Engine:
    if database_url.startswith("sqlite"):
        # JSON as strict as Postgres's: NaN/Infinity refused on SQLite too, so a test on SQLite finds what
        # Postgres would reject (orchestrator/numbers.py keeps such values as strings).
        engine = create_engine(database_url, connect_args={"check_same_thread": False, "timeout": 30},
                               json_serializer=functools.partial(json.dumps, allow_nan=False))  # fmt: skip

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(conn, _record) -> None:  # type: ignore[no-untyped-def]
            # WAL lets the dashboard read while the launcher writes; FKs are off by default in SQLite.
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    engine = create_engine(database_url, pool_pre_ping=True, pool_size=10, max_overflow=20)

    @event.listens_for(engine, "do_connect")
    def _wait_for_restart(dialect, _record, cargs, cparams):  # type: ignore[no-untyped-def]
        # A Postgres restart (a fast one takes well under a second) refuses connections for a moment:
        # new connections, pre-ping's reconnects included, wait it out instead of failing the request.
        deadline = time.monotonic() + CONNECT_WAIT_S
        while True:
            try:
                return dialect.loaded_dbapi.connect(*cargs, **cparams)
            except dialect.loaded_dbapi.OperationalError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    return engine


@cache
def session_factory(database_url: str) -> sessionmaker[Session]:
    return sessionmaker(engine_for(database_url), expire_on_commit=False)


@contextmanager
def session_scope(database_url: str) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    session = session_factory(database_url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
