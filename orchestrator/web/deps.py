"""Shared request dependencies as Annotated aliases: settings, a DB session, write authorisation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, TypeVar

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from orchestrator.db.session import session_scope
from orchestrator.settings import Settings
from orchestrator.web.guard import UNAUTHORIZED, token_matches


def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_app_settings)]


def get_session(settings: SettingsDep) -> Iterator[Session]:
    # FastAPI re-raises a route's exception (HTTPException included) at this yield: the scope rolls back.
    with session_scope(settings.database_url) as session:
        yield session


# scope="function": the commit runs when the route returns, before the response is sent, so a failed
# commit is a 500 and never a 2xx for a write that did not happen.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]

_bearer = HTTPBearer(auto_error=False)


def require_token(
    request: Request, _creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """The route-level check (and the OpenAPI security scheme); orchestrator.web.guard.TokenGuard has
    already refused a missing token before the body was read."""
    if not token_matches(request.headers.get("authorization"), request.app.state.api_token):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, detail=UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})


AuthDep = Annotated[None, Depends(require_token)]
# The OpenAPI entry of every route that takes AuthDep.
AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {401: {"description": "missing or wrong bearer token"}}


T = TypeVar("T")
# Ids (and offsets, event cursors) are 32-bit integers; anything outside that range cannot exist and must not
# reach Postgres, which refuses the query (a 500).
MAX_ID = 2**31 - 1


def get_or_404(session: Session, model: type[T], obj_id: int) -> T:
    """The row with this id, or 404 naming what was not found."""
    obj = session.get(model, obj_id) if 1 <= obj_id <= MAX_ID else None
    if obj is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no {model.__name__.lower()} with id {obj_id}")
    return obj
