"""The sweep-runner lock: only the runner holding it fires or advances a sweep, so `ablate serve` and
`ablate schedules run` side by side never run a sweep twice."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import make_url

from orchestrator.db.session import engine_for

RUNNER_LOCK_KEY = 0x61626C61  # "abla": the Postgres advisory lock the sweep runner holds while it ticks


@contextmanager
def runner_lock(database_url: str) -> Iterator[bool]:
    """Yield True when this runner holds the sweep-runner lock (until the block ends), else False.

    Postgres: a session advisory lock on a connection of its own; SQLite: flock on a file beside the
    database. Both are released by the operating system or server when the holder dies.
    """
    if make_url(database_url).get_backend_name() == "postgresql":
        with engine_for(database_url).connect() as conn:
            mine = bool(conn.scalar(text("SELECT pg_try_advisory_lock(:k)"), {"k": RUNNER_LOCK_KEY}))
            conn.commit()
            try:
                yield mine
            finally:
                if mine:
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": RUNNER_LOCK_KEY})
                    conn.commit()
        return
    database = make_url(database_url).database or ""
    path = Path(f"{database}.sweep-runner.lock") if database and database != ":memory:" else None
    if path is None:  # an in-memory database belongs to one process
        yield True
        return
    with path.open("a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
