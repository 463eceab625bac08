"""Who this controller is to what it rents: its id in every instance's label (`ablate.<id>.s<sweep>`)
and its SSH key, the only key let into an instance.

The reaper destroys the instances labelled with this id whose sweep is not live in this controller's
database, so an id must belong to one database alone: two installations with one id on one account
would each reap the other's instances as orphans. ABLATE_CONTROLLER_ID names it explicitly; unset, it
is generated at first use and stored in the database (table `installation`), so every installation
has its own and every process on one database (`ablate serve`, `ablate schedules run`) uses the same.
"""

from __future__ import annotations

import secrets
from pathlib import Path

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


def controller_public_key(ssh_key: Path) -> str:
    """The controller's public key for rented nodes; an ed25519 key pair is made (0600) if none exists."""
    pub = ssh_key.with_name(ssh_key.name + ".pub")
    if not ssh_key.exists():
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        key = Ed25519PrivateKey.generate()
        ssh_key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        ssh_key.touch(mode=0o600)
        ssh_key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
            )
        )
        public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        pub.write_text(public.decode() + " ablate-controller\n")
    return pub.read_text().strip()
