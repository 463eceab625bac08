"""The token check as an ASGI middleware: it answers 401 before the request body is read.

A dependency (orchestrator.web.deps.AuthDep) runs only after FastAPI has read and parsed the body, so
an unauthenticated client could make the server hold and parse any body it sends. This middleware
sees only the method, path and headers. Which requests need the token:
- every write (any method but GET, HEAD, OPTIONS);
- reads that expose infrastructure: nodes (hosts, users, key paths), schedules (sweep errors with
  remote command output) and events (nodes' commands and their output);
- with `private_reads` (ABLATE_PRIVATE_READS), every read except /healthz and the dashboard's static
  files.
Body size is FastAPI's own `max_body_size` (413 before parsing), set in orchestrator.app.
"""

from __future__ import annotations

import secrets

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Reads that always need the token.
PRIVATE_PREFIXES = ("/api/nodes", "/api/schedules", "/api/events")
# Reads that never need it: liveness probes and the dashboard's CSS/JS.
PUBLIC_PREFIXES = ("/healthz", "/dashboard/static/")
UNAUTHORIZED = "missing or wrong bearer token: send 'Authorization: Bearer <ABLATE_API_TOKEN>'"


def token_matches(authorization: str | None, expected: str) -> bool:
    """True when the Authorization header is exactly `Bearer <expected>`."""
    if not authorization:
        return False
    scheme, _, credentials = authorization.partition(" ")
    if scheme.lower() != "bearer" or not credentials:
        return False
    # Bytes: compare_digest raises TypeError on non-ASCII str, which would be a 500 instead of a 401.
    return secrets.compare_digest(credentials.strip().encode("utf-8", "surrogateescape"), expected.encode())


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p.rstrip("/") or path.startswith(p.rstrip("/") + "/") for p in prefixes)


def needs_token(method: str, path: str, private_reads: bool) -> bool:
    if method not in SAFE_METHODS:
        return True
    if _under(path, PRIVATE_PREFIXES):
        return True
    return private_reads and not _under(path, PUBLIC_PREFIXES)


class TokenGuard:
    """401 for requests that need the token and lack it, before anything reads their body."""

    def __init__(self, app: ASGIApp, token: str, private_reads: bool = False) -> None:
        self.app, self.token, self.private_reads = app, token, private_reads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and needs_token(scope["method"], scope["path"], self.private_reads):
            # latin-1: what the HTTP server decoded the raw header bytes with; never raises.
            if not token_matches(Headers(scope=scope).get("authorization"), self.token):
                response = JSONResponse(
                    {"detail": UNAUTHORIZED}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
