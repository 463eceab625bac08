"""What a worker reports when its arm fails: one description a run can store (`describe_error`), and
the failures that are their own description already (`Described`: a command arm's, a rank's)."""

from __future__ import annotations

import re
import sysconfig
import traceback
from collections.abc import Iterable

# Terminal colour codes (Ray wraps its messages in them): never stored in an error the operator reads.
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


# An env value at least this long is masked in what the worker reports (`masked`): a key or a token is,
# while a value like "1" or "0.5" would mask every number of the message and hides nothing.
MASKED_MIN_CHARS = 8
MASKED = "<hidden>"  # as the controller shows an env value (orchestrator/results/views.py HIDDEN)


def masked(text: str, values: Iterable[str]) -> str:
    """`text` with each of `values` (a command arm's env values) that is MASKED_MIN_CHARS or longer replaced
    by MASKED, longest first: a script's failure quotes what it wrote, which may be its own API key, and the
    first line of the error is the run's event that every reader and tracker gets."""
    for value in sorted({v for v in values if len(v) >= MASKED_MIN_CHARS}, key=len, reverse=True):
        text = text.replace(value, MASKED)
    return text


class Described(Exception):
    """A failure whose message is the run's error as it stands (no traceback of ours adds to it)."""


class RankFailed(Described):
    """A rank of a data-parallel arm (worker/ranks.py) failed or died: the whole arm ends."""


def _short_path(path: str) -> str:
    """worker/actor.py for the project's files, torch/nn/modules/module.py for a library's."""
    if "/site-packages/" in path:
        return path.rsplit("/site-packages/", 1)[1]
    for package in ("/worker/", "/model/", "/orchestrator/"):
        if package in path:
            return package.lstrip("/") + path.rsplit(package, 1)[1]
    return path


def describe_error(exc: BaseException) -> str:
    """What the run stores when its worker fails: `Type: message (at file:line in function)` on the first
    line, the last frames of the traceback below it, without terminal escape codes. A `Described` failure
    is its own message (a command arm's stderr, a failing rank's own description), not our frames."""
    if isinstance(exc, Described):
        return ANSI_ESCAPE.sub("", str(exc))
    head = traceback.format_exception_only(exc)[-1].strip()
    frames = traceback.extract_tb(exc.__traceback__)
    stdlib = sysconfig.get_paths()["stdlib"]
    ours = [f for f in frames if "/site-packages/" not in f.filename and not f.filename.startswith(stdlib)]
    if frames:  # the innermost frame outside the libraries: where our code met the error (not pathlib's)
        inner = (ours or frames)[-1]
        head += f" (at {_short_path(inner.filename)}:{inner.lineno} in {inner.name})"
    tail = "".join(traceback.format_exception(exc, limit=-8)).rstrip()
    return ANSI_ESCAPE.sub("", f"{head}\n{tail}")
