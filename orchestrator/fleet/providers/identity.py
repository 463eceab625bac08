"""This controller's id, the controller part of every rented instance's label (`ablate.<id>.s<sweep>`).

The reaper destroys the instances labelled with this id whose sweep is not live in this controller's
database, so an id must belong to one database alone: two installations with one id on one account
would each reap the other's instances as orphans. ABLATE_CONTROLLER_ID names it explicitly; unset, it
is generated at first use and stored in the database (table `installation`), so every installation
has its own and every process on one database (`ablate serve`, `ablate schedules run`) uses the same.
"""

from __future__ import annotations

import secrets

from sqlalchemy.exc import IntegrityError

from orchestrator.db.models import Installation
from orchestrator.db.session import session_scope
from orchestrator.settings import Settings

_ROW = 1  # the one row of `installation`


def controller_id(settings: Settings) -> str:
    """ABLATE_CONTROLLER_ID when set, else the id stored in the database (generated at first use)."""
    if settings.controller_id is not None:
        return settings.controller_id
    return stored_controller_id(settings.database_url)


def stored_controller_id(database_url: str) -> str:
    """The installation's generated id; made and stored on the first call. Two processes racing to make
    it both end up with the one that was stored first."""
    with session_scope(database_url) as session:
        row = session.get(Installation, _ROW)
        if row is not None:
            return row.controller_id
    try:
        with session_scope(database_url) as session:
            # 10 hex digits: two installations on one account never draw the same id in practice.
            session.add(Installation(id=_ROW, controller_id=f"ablate-{secrets.token_hex(5)}"))
    except IntegrityError:
        pass  # another process stored its id first: that one is the installation's
    with session_scope(database_url) as session:
        return session.get_one(Installation, _ROW).controller_id
