"""How a command reaches the controller: its URL (--url, else ABLATE_URL, else http://ABLATE_HOST:ABLATE_PORT),
its token (ABLATE_API_TOKEN, else the one `ablate serve` wrote under home_dir), a `Client` over its REST
API, its errors as one line, and `--json` output. No command that reads a controller opens a database."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import BaseModel, TypeAdapter

from orchestrator.cli import CLIError
from orchestrator.settings import load_settings

if TYPE_CHECKING:
    from orchestrator.client import ApiError, Client

UrlOption = Annotated[
    str | None, typer.Option("--url", help="The controller (default: ABLATE_URL, else http://ABLATE_HOST:ABLATE_PORT)")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the API's answer as JSON instead of a table")]


def controller_url(url: str | None = None) -> str:
    settings = load_settings()
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    return (url or settings.url or f"http://{host}:{settings.port}").rstrip("/")


def api_token() -> str | None:
    """ABLATE_API_TOKEN, else the token `ablate serve` wrote on this machine; None: reads go without."""
    from orchestrator.server import read_token

    return read_token(load_settings())


def required_token() -> str:
    """The token, for a command that changes something: a one-line CLIError where there is none."""
    token = api_token()
    if token is None:
        raise CLIError(f"no API token: set ABLATE_API_TOKEN to the controller's (`ablate serve` writes it to "
                       f"{load_settings().token_file})")
    return token


@contextmanager
def controller(url: str | None = None, token_needed: bool = False, timeout: float | None = 30.0) -> Iterator[Client]:
    """A Client of the controller; its errors (unreachable, a rejected token, 404, 422) leave as one-line
    CLIErrors that say what to do. `timeout` None: a node's SSH work, which takes as long as it takes."""
    from orchestrator.client import ApiError, Client

    base = controller_url(url)
    token = required_token() if token_needed else api_token()
    with Client(base, token, timeout) as client:
        try:
            yield client
        except ApiError as exc:
            raise CLIError(said(exc, base)) from None


def said(exc: ApiError, base: str) -> str:
    """An API error as the line the user reads."""
    from orchestrator.cli.tables import terminal_safe

    if exc.status == 0:
        return unreachable_text(base)
    if exc.status == 401:
        return token_rejected_text(base)
    # 424: a node the controller could not reach or whose command failed; its message names the node.
    return terminal_safe(exc.message if exc.status in (404, 409, 422, 424) else str(exc))


def unreachable_text(base: str) -> str:
    """No controller answers: how to start one or point at one; after `ablate demo`, where its grid is."""
    text = f"no ablate server reachable at {base}: start one with `ablate serve`, or point ABLATE_URL (or --url) at one"
    demo_db = Path(load_settings().home_dir) / "demo.db"
    if demo_db.is_file():
        text += f"; the demo's grids are in {demo_db}: `ablate demo --hold` keeps its dashboard and API up"
    return text


def token_rejected_text(base: str) -> str:
    return f"{base} rejected the API token: use the server's (ABLATE_API_TOKEN or {load_settings().token_file})"


def print_json(value: BaseModel | list[Any] | dict[str, Any]) -> None:
    """`value` (an API model, or a list of them) as indented JSON on stdout."""
    data = TypeAdapter(Any).dump_python(value, mode="json")
    typer.echo(json.dumps(data, indent=2))


def send(method: str, path: str, url: str | None = None, **kwargs: Any) -> tuple[str, Any]:
    """One request with the token, for a command that reads the answer's status itself (submit's 422 names
    its file): (the controller's URL, the httpx response); unreachable or a rejected token is one line."""
    import httpx

    base = controller_url(url)
    try:
        resp = httpx.request(method, f"{base}{path}", timeout=30,
                             headers={"Authorization": f"Bearer {required_token()}"}, **kwargs)
    except httpx.HTTPError:
        raise CLIError(unreachable_text(base)) from None
    if resp.status_code == 401:
        raise CLIError(token_rejected_text(base))
    return base, resp
