"""The package's modules import each other without a circle.

Both kinds of import count: a module-level one (a circle there fails at import time, depending on
which module is imported first) and one inside a function (a circle there still ties modules that
should be layered: api -> worker -> schedules -> api was one). Imports under ``if TYPE_CHECKING:``
do not count: they never run, and only name a type in an annotation (the backends annotate the
``Store`` that calls them). Migrations are left out: Django loads them by itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "django_rws_jobs"


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if "migrations" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that module ``name`` imports anywhere in its text."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    targets: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    type_only = {
        id(n)
        for block in ast.walk(tree)
        if _is_type_checking_block(block)
        for stmt in block.body
        for n in ast.walk(stmt)
    }  # type: ignore[attr-defined]
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in known:  # from . import wakeup: the module itself
                    targets.add(f"{base}.{alias.name}")
                elif base in known:
                    targets.add(base)
    targets.discard(name)
    return targets


def _is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
    )


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle in ``graph`` as a path that ends where it starts, or None."""
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt, path + [nxt])
                if found:
                    return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [start])
            if found:
                return found
    return None


def test_the_package_has_no_import_cycle():
    known = modules()
    graph = {name: imported(name, path, known) for name, path in known.items()}
    assert "django_rws_jobs.ids" in graph["django_rws_jobs.api"]  # the reading works
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_a_cycle_is_found():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
