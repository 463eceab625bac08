"""Error responses: spec errors become 422s naming the field path, state conflicts 409s.

Error bodies echo field names from the request, which may hold any text (lone surrogates
included), so they are rendered as ASCII JSON: whatever the input, the answer is never a 500.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from orchestrator.grids import GridError, RunConflict


class SafeJSONResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def _detail(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # The offending input is not echoed back: it can be large and it is what the client just sent.
    return [{k: v for k, v in err.items() if k in ("loc", "msg", "type")} for err in errors]


async def _request_invalid(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    content = {"detail": jsonable_encoder(_detail(list(exc.errors())))}
    return SafeJSONResponse(status_code=status.HTTP_422_UNPROCESSABLE_CONTENT, content=content)


async def _grid_invalid(_: Request, exc: Exception) -> JSONResponse:
    # The same shape as FastAPI's own 422s, with the path from the body root, e.g.
    # ["body", "arms", 1, "optimizer", "asymflow"].
    assert isinstance(exc, GridError)
    detail = [{**err, "loc": ["body", *err["loc"]]} for err in exc.errors]
    return SafeJSONResponse(status_code=status.HTTP_422_UNPROCESSABLE_CONTENT, content={"detail": detail})


async def _conflict(_: Request, exc: Exception) -> JSONResponse:
    return SafeJSONResponse(status_code=status.HTTP_409_CONFLICT, content={"detail": str(exc)})


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _request_invalid)
    app.add_exception_handler(GridError, _grid_invalid)
    app.add_exception_handler(RunConflict, _conflict)
