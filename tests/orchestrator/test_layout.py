"""The layout shows the architecture: dependencies point one way and no import circle, in orchestrator/,
worker/ and model/; and no file past 450 lines (there, in tests/, bench/ and the dashboard's scripts) that
is not named as one purpose.

Read from the source with `ast` (lazy imports inside functions count too): a rule broken here is an
import someone added, and the test names it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "orchestrator"
PACKAGES = ("orchestrator", "worker", "model")
# What each package must never import: data flows orchestrator -> worker -> model, never back.
PACKAGE_FORBIDDEN = {"model": ("worker", "orchestrator"), "worker": ("orchestrator",), "orchestrator": ()}
# A smell, not a target: a file past MAX_LINES is split where it divides by purpose, or named in ONE_PURPOSE
# with why it is one; past HARD_MAX_LINES nothing is one purpose. Tests, bench scripts and the dashboard's
# scripts are held to it as the packages are.
MAX_LINES = 450
HARD_MAX_LINES = 700
ONE_PURPOSE = {
    "tests/cluster/testbed.py": "one class, the namespace test bed: building, authorizing, stopping and removing nodes",
    "model/spec.py": "the arm spec: one model per section of the contract every layer validates against",
}
DOMAINS = ("grids", "runs", "results", "trackers", "fleet", "sweeps")
SURFACES = ("api", "cli", "dashboard", "client")
SHARED = ("db", "settings", "vocabulary", "messages", "errors", "numbers", "version", "web")
# What each part of orchestrator/ must never import (docs/architecture.md, "Layers").
FORBIDDEN = {
    "grids": ("runs", "results", "trackers", "fleet", "sweeps", *SURFACES),
    "runs": ("results", "trackers", "sweeps", *SURFACES),
    "results": ("trackers", "sweeps", *SURFACES),
    "trackers": ("sweeps", *SURFACES),
    "fleet": ("grids", "runs", "results", "trackers", "sweeps", *SURFACES),
    "sweeps": SURFACES,
    "dashboard": ("api",),  # it reads through the read side (results), like the API
    **{shared: (*DOMAINS, *SURFACES, "server") for shared in SHARED},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:`: names for annotations, never imported at run time."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            skip.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return skip


def imports_of(path: Path, packages: tuple[str, ...] = ("orchestrator",), types: bool = False) -> set[str]:
    """Every module of `packages` that `path` imports at run time, at any depth of the file (lazy imports
    included, `if TYPE_CHECKING:` blocks only with `types`)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    type_only = set() if types else _type_only(tree)
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in packages:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] in packages)
    return found


def part_of(module: str) -> str:
    """orchestrator.grids.service -> runs; orchestrator.settings -> settings."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


SOURCES = sorted(ROOT.rglob("*.py"))
GRAPH = {module_name(p): imports_of(p) for p in SOURCES}
ALL_SOURCES = sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py"))
ALL_GRAPH = {module_name(p): imports_of(p, PACKAGES) for p in ALL_SOURCES}


def test_no_file_is_over_the_limit() -> None:
    files = [*ALL_SOURCES, *(REPO / "tests").rglob("*.py"), *(REPO / "bench").rglob("*.py"),
             *(ROOT / "dashboard" / "static").glob("*.js")]  # fmt: skip
    lines = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in files}
    long = {f: n for f, n in lines.items() if n > MAX_LINES and f not in ONE_PURPOSE}
    assert long == {}, f"split these by purpose, or name them in ONE_PURPOSE with why each is one: {long}"
    huge = {f: n for f, n in lines.items() if n > HARD_MAX_LINES}
    assert huge == {}, f"past {HARD_MAX_LINES} lines no file is one purpose: {huge}"


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_import_downwards_only(package: str) -> None:
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in ALL_GRAPH.items()
        if module.split(".")[0] == package
        for target in targets
        if target.split(".")[0] in PACKAGE_FORBIDDEN[package]
    )
    assert wrong == [], f"{package} must not import {PACKAGE_FORBIDDEN[package]}"


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_dependencies_point_one_way(part: str) -> None:
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if part_of(module) == part
        for target in targets
        if part_of(target) in FORBIDDEN[part]
    )
    assert wrong == [], f"{part} must not import {FORBIDDEN[part]}"


def test_every_domain_folder_says_what_lives_there() -> None:
    for folder in (*DOMAINS, "web", "fleet/providers", "results/reports"):
        init = ROOT / folder / "__init__.py"
        assert init.is_file() and ast.get_docstring(ast.parse(init.read_text())), f"{init} needs a docstring"


def test_no_import_circle_between_parts() -> None:
    """Parts (runs, fleet, sweeps, api, db, settings, ...) form a graph without cycles; a module importing a
    sibling of its own part is fine."""
    edges: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        for target in targets:
            if part_of(target) != part_of(module) and part_of(target) in GRAPH_PARTS:
                edges.setdefault(part_of(module), set()).add(part_of(target))
    cycle = find_cycle(edges)
    assert cycle is None, " -> ".join(cycle or [])


def test_no_import_circle_between_modules() -> None:
    """Across orchestrator/, worker/ and model/ (a package's `__init__` counts as a module)."""
    edges = {m: {t for t in ts if t in ALL_GRAPH and t != m} for m, ts in ALL_GRAPH.items()}
    cycle = find_cycle(edges)
    assert cycle is None, " -> ".join(cycle or [])


def test_no_import_circle_through_type_names() -> None:
    """Type-only imports (`if TYPE_CHECKING:`) count too: two modules that name each other's types know each
    other, and what both need belongs below them."""
    graph = {module_name(p): imports_of(p, PACKAGES, types=True) for p in ALL_SOURCES}
    edges = {m: {t for t in ts if t in graph and t != m} for m, ts in graph.items()}
    cycle = find_cycle(edges)
    assert cycle is None, " -> ".join(cycle or [])


GRAPH_PARTS = {part_of(m) for m in GRAPH}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle in the directed graph as a list of nodes (first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None
