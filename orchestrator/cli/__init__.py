"""The `ablate` command. Each command group lives in its own module and registers itself on `app`.

Commands import heavy libraries (torch, ray) inside their bodies, so `ablate --help` stays fast.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer
from pydantic import ValidationError

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Ablation orchestration for DiT training.")


def _print_version(asked: bool) -> None:
    if asked:
        from orchestrator.version import DISTRIBUTION, version_text

        typer.echo(f"{DISTRIBUTION} {version_text()}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True,
                     help="Print the version (and the commit where known), as /healthz and the report say it"),
    ] = False,
) -> None:
    pass


class CLIError(RuntimeError):
    """An error the user can fix; printed as one line, exit code 2."""


@contextmanager
def service_errors() -> Iterator[None]:
    """What the node and schedule services raise (not found, taken, unreachable, invalid input) and
    database errors, as one clear line."""
    from sqlalchemy.exc import SQLAlchemyError

    from orchestrator.fleet.errors import NodeError
    from orchestrator.messages import database_error_text, validation_text
    from orchestrator.sweeps.schedules import ScheduleError

    try:
        yield
    except (NodeError, ScheduleError) as exc:
        raise CLIError(str(exc)) from None
    except ValidationError as exc:
        raise CLIError(validation_text(exc)) from None
    except SQLAlchemyError as exc:
        raise CLIError(f"database error: {database_error_text(exc)}") from None


def free_port(host: str, preferred: int, or_any: bool = False) -> int | None:
    """`preferred` when it can be bound on `host`; else, with `or_any`, a port the OS picks; else None."""
    for port in (preferred, 0) if or_any else (preferred,):
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return sock.getsockname()[1]
    return None


def _register() -> None:
    # Imported for their side effect of adding commands to `app`.
    from orchestrator.cli import (
        core,  # noqa: F401
        data,  # noqa: F401
        demo,  # noqa: F401
        evaluate,  # noqa: F401
        events,  # noqa: F401
        importer,  # noqa: F401
        mcp_server,  # noqa: F401
        model_info,  # noqa: F401
        nodes,  # noqa: F401
        plan,  # noqa: F401
        rented,  # noqa: F401
        replay,  # noqa: F401
        report,  # noqa: F401
        schedules,  # noqa: F401
        stop,  # noqa: F401
        train,  # noqa: F401
        weights,  # noqa: F401
    )


def main() -> None:
    """Console-script entry: known errors become one clear line instead of a traceback."""
    from orchestrator.grids.arms import ArmError
    from orchestrator.messages import validation_text
    from orchestrator.settings import SettingsError

    _register()
    try:
        app(standalone_mode=False)
    except (CLIError, ArmError, SettingsError, FileNotFoundError) as exc:
        from orchestrator.cli.tables import terminal_safe  # an error may quote what a node sent

        typer.secho(f"error: {terminal_safe(str(exc))}", fg="red", err=True)
        sys.exit(2)
    except ValidationError as exc:
        typer.secho(f"error: invalid spec: {validation_text(exc, root='(spec)')}", fg="red", err=True)
        sys.exit(2)
    except typer.Abort:
        sys.exit(130)
    except (typer.Exit, SystemExit) as exc:
        code = getattr(exc, "exit_code", getattr(exc, "code", 0))
        sys.exit(code)
    except Exception as exc:  # click usage errors arrive here in non-standalone mode
        import click

        # typer >= 0.20 vendors click: its usage errors are TyperException, not click.ClickException.
        if isinstance(exc, click.ClickException | typer.TyperException) and hasattr(exc, "show"):
            exc.show()
            sys.exit(getattr(exc, "exit_code", 2))
        raise
