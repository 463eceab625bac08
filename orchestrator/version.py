"""The version this code reports, from one place: `ablate --version`, /healthz and the report say it.

- Installed from a wheel or an sdist (pip, not editable): the distribution's version, which setuptools-scm
  took from git when it was built: `0.2.0` at the tag `v0.2.0`, `0.2.1.dev3+g1a2b3c4` three commits past it,
  `0.1.devN+g<commit>` where no tag is reachable (README.md, "Releases").
- A source tree (a checkout on PYTHONPATH, an editable install, a tree copied to a GPU node): "source tree,
  commit <commit>", read from git where the tree has its .git, else from the version file setuptools-scm
  wrote at build time (orchestrator/_version.py, not in git), else "source tree, commit unknown". An
  editable install's own version was fixed when it was installed; the tree has moved on since.
"""

from __future__ import annotations

import json
import re
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "ablate-dit"  # `ablate` on the index is another project; the command is still `ablate`
TREE = Path(__file__).resolve().parents[1]  # the folder holding orchestrator/, worker/, model/ and arms/
UNKNOWN = "unknown"  # only ever in "source tree, commit unknown"
_COMMIT = re.compile(r"\+g([0-9a-f]{7,40})|commit ([0-9a-f]{7,40})")


@cache
def version_text() -> str:
    """What `ablate --version`, /healthz and the report say; never a bare "unknown"."""
    installed = _installed_version()
    if installed is not None:
        commit = _file_commit()
        return f"{installed} (commit {commit})" if commit and commit_of(installed) is None else installed
    return f"source tree, commit {_git_commit() or _file_commit() or UNKNOWN}"


def commit_of(text: str) -> str | None:
    """The commit a version text names (`0.1.dev3+g1a2b3c4`, "source tree, commit 1a2b3c4"), or None."""
    found = _COMMIT.search(text)
    return (found.group(1) or found.group(2)) if found else None


def same_code(a: str, b: str) -> bool:
    """Whether two version texts name the same code: equal, or naming one commit (a wheel built from commit
    1a2b3c4 says `0.1.dev3+g1a2b3c4`, the tree it was built from "source tree, commit 1a2b3c4d"). Two trees
    whose commits are unknown may hold anything: never the same."""
    if a == b:
        return not a.endswith(f"commit {UNKNOWN}")
    first, second = commit_of(a), commit_of(b)
    return first is not None and second is not None and (first.startswith(second) or second.startswith(first))


def _installed_version() -> str | None:
    """The distribution's version where pip installed this very file from a wheel or an sdist; None for an
    editable install, for the egg-info a build leaves in a source tree (no INSTALLER file), or where the
    installed distribution is another copy than the one running."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    if dist.read_text("INSTALLER") is None:
        return None
    direct = dist.read_text("direct_url.json")
    if direct and json.loads(direct).get("dir_info", {}).get("editable"):
        return None
    here = Path(str(dist.locate_file("orchestrator/version.py")))
    return dist.version if here.resolve() == Path(__file__).resolve() else None


def _git_commit() -> str | None:
    if not (TREE / ".git").exists():  # a directory in a clone, a file in a worktree
        return None
    try:  # safe.directory: a tree owned by another user (a node's) is read, never written
        done = subprocess.run(["git", "-c", "safe.directory=*", "-C", str(TREE), "rev-parse", "--short=9", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):  # no git on this machine
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and re.fullmatch(r"[0-9a-f]{7,40}", commit) else None


def _file_commit() -> str | None:
    """The commit in the version file setuptools-scm wrote at build time (`g1a2b3c4`), or None."""
    try:
        from orchestrator import _version  # type: ignore[attr-defined]
    except ImportError:
        return None
    commit = str(getattr(_version, "commit_id", None) or "").removeprefix("g")
    return commit if re.fullmatch(r"[0-9a-f]{7,40}", commit) else None
