"""Shared request dependencies as Annotated aliases: settings, a DB session, write authorisation."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Annotated, TypeVar

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from orchestrator.db.session import session_scope
from orchestrator.settings import Settings


def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_app_settings)]


def get_session(settings: SettingsDep) -> Iterator[Session]:
    # FastAPI re-raises a route's exception (HTTPException included) at this yield: the scope rolls back.
    with session_scope(settings.database_url) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]

_bearer = HTTPBearer(auto_error=False)


def require_token(
    request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    expected: str = request.app.state.api_token
    # Bytes: compare_digest raises TypeError on non-ASCII str, which would be a 500 instead of a 401.
    if creds is None or not secrets.compare_digest(creds.credentials.encode(), expected.encode()):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="missing or wrong bearer token: send 'Authorization: Bearer <ABLATE_API_TOKEN>'",
            headers={"WWW-Authenticate": "Bearer"},
        )


AuthDep = Annotated[None, Depends(require_token)]


T = TypeVar("T")
# Ids are 32-bit integer keys; anything outside that range cannot exist (and must not reach Postgres).
_MAX_ID = 2**31 - 1


def get_or_404(session: Session, model: type[T], obj_id: int) -> T:
    """The row with this id, or 404 naming what was not found."""
    obj = session.get(model, obj_id) if 1 <= obj_id <= _MAX_ID else None
    if obj is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no {model.__name__.lower()} with id {obj_id}")
    return obj
