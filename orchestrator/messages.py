"""Errors as the one line a user reads: validation errors with their field paths, database errors,
and database URLs with the password masked."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI imports this module; it stays light
    from pydantic import ValidationError


def errors_text(errors: Iterable[Mapping[str, Any]], root: str = "(input)", skip: int = 0) -> str:
    """Pydantic-style errors as `arms.1.optimizer.asymflow: Extra inputs are not permitted; ...`.

    root: the path shown for an error on the whole object; skip: leading `loc` parts to leave out
    (1 drops FastAPI's "body").
    """
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc'][skip:]) or root}: {str(e['msg']).removeprefix('Value error, ')}"
        for e in errors
    )


def validation_text(exc: ValidationError, root: str = "(input)") -> str:
    """A ValidationError as one line, every field path with its problem."""
    return errors_text(exc.errors(include_url=False, include_context=False, include_input=False), root)


def yaml_error_text(exc: Exception) -> str:
    """A YAML parse error as one line with where it is: "line 3, column 6: expected ',' or ']', but got ':'
    (while parsing a flow sequence from line 2)". PyYAML's marks count from 0; an editor's from 1."""
    mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
    if mark is None or not problem:
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    context, started = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    where = f" from line {started.line + 1}" if started is not None and started.line != mark.line else ""
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" + (f" ({context}{where})" if context else "")


def database_error_text(exc: BaseException) -> str:
    """The first line of a database error (the driver's own message, without SQLAlchemy's SQL dump)."""
    return (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [type(exc).__name__])[0]


def masked_url(url: str) -> str:
    """A database URL with any password shown as ***, for logs and messages."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


# `scheme://user:password@`: the password of any URL inside a text (a client's error quotes the URL it used).
URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:)[^\s/@]+@")


def masked_text(text: str) -> str:
    """`text` with the password of every URL in it shown as *** (`http://user:***@host`), for errors that
    go into events and logs."""
    return URL_PASSWORD.sub(r"\g<head>***@", text)


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    """Without terminal colour codes (Ray wraps its actor errors in them): what gets stored is read on a
    dashboard and in a database, not a terminal."""
    return ANSI_ESCAPE.sub("", text)
