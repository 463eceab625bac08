"""Error responses, one status per kind of domain error (orchestrator/errors.py): an invalid body
422 naming the field path, not found 404, a state conflict 409, a node that cannot be reached or
refuses a command, or a rented-node provider that fails, 424. Routes raise; they never build error responses themselves.

Error bodies echo field names from the request, which may hold any text (lone surrogates
included), so they are rendered as ASCII JSON: whatever the input, the answer is never a 500.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError

from orchestrator.errors import Conflict, InvalidBody, NotFound
from orchestrator.fleet.errors import NodeError
from orchestrator.fleet.providers.base import ProviderError


class SafeJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


VALUE_ERROR_PREFIX = "Value error, "  # pydantic's words before a validator's own message


def _detail(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # The offending input is not echoed back: it can be large and it is what the client just sent. A
    # validator's message is the reason itself, so pydantic's prefix goes.
    return [{k: (str(v).removeprefix(VALUE_ERROR_PREFIX) if k == "msg" else v) for k, v in err.items()
             if k in ("loc", "msg", "type")} for err in errors]  # fmt: skip


async def _request_invalid(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    content = {"detail": jsonable_encoder(_detail(list(exc.errors())))}
    return SafeJSONResponse(status_code=status.HTTP_422_UNPROCESSABLE_CONTENT, content=content)


async def _body_invalid(_: Request, exc: Exception) -> JSONResponse:
    # The same shape as FastAPI's own 422s, with the path from the body root, e.g.
    # ["body", "arms", 1, "optimizer", "asymflow"].
    assert isinstance(exc, InvalidBody)
    detail = [{**err, "loc": ["body", *err["loc"]]} for err in exc.errors]
    return SafeJSONResponse(status_code=status.HTTP_422_UNPROCESSABLE_CONTENT, content={"detail": detail})


def _message(code: int) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    async def handler(_: Request, exc: Exception) -> JSONResponse:
        return SafeJSONResponse(status_code=code, content={"detail": str(exc)})

    return handler


async def _database_unavailable(_: Request, exc: Exception) -> JSONResponse:
    # The database is restarting or unreachable: say so and when to retry, instead of a bare 500.
    # (A write that got this answer was rolled back: nothing was stored.)
    return SafeJSONResponse(
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        content={"detail": "the database is unavailable (restarting or unreachable); retry shortly"},
        headers={"Retry-After": "2"},
    )


def install_error_handlers(app: FastAPI) -> None:
    # Looked up along the exception's MRO: NodeNotFound is a NotFound (404) before it is a NodeError (424).
    app.add_exception_handler(RequestValidationError, _request_invalid)
    app.add_exception_handler(InvalidBody, _body_invalid)
    app.add_exception_handler(NotFound, _message(status.HTTP_404_NOT_FOUND))
    app.add_exception_handler(Conflict, _message(status.HTTP_409_CONFLICT))
    app.add_exception_handler(NodeError, _message(status.HTTP_424_FAILED_DEPENDENCY))
    app.add_exception_handler(ProviderError, _message(status.HTTP_424_FAILED_DEPENDENCY))
    for exc in (OperationalError, InterfaceError, DisconnectionError):
        app.add_exception_handler(exc, _database_unavailable)
