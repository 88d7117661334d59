"""The package's modules import each other without a circle, and each part imports only the parts
below it (the map at the top of docs/design.md).

Both kinds of import count: a module-level one (a circle there fails at import time, depending on
which module is imported first) and one inside a function (a circle there still ties modules that
should be layered: api -> worker -> schedules -> api was one). For the circle, imports under ``if
TYPE_CHECKING:`` do not count: they never run. For the parts they count too: a part that names a
type of a part above it depends on it all the same (the backends name the ``Store`` that calls
them by a protocol of their own). Migrations are left out: Django loads them by itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.db import connection

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


def imported(name: str, path: Path, known: dict[str, Path], *, type_only_too: bool = False) -> set[str]:
    """The package's modules that module ``name`` imports anywhere in its text (under ``if
    TYPE_CHECKING:`` too when ``type_only_too``)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    targets: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    type_only = (
        set()
        if type_only_too
        else {
            id(n)
            for block in ast.walk(tree)
            if _is_type_checking_block(block)
            for stmt in block.body
            for n in ast.walk(stmt)
        }
    )  # type: ignore[attr-defined]
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
    assert "django_rws_jobs.queue.ids" in graph["django_rws_jobs.api.enqueue"]  # the reading works
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_a_cycle_is_found():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


#: The parts, bottom first: a module may import its own part and the parts below it, never one
#: above. The entries are the first name under django_rws_jobs ("" is the package itself).
PARTS: list[tuple[str, set[str]]] = [
    ("base", {"conf", "exceptions", "signals", "models"}),
    ("database", {"database"}),
    ("flow", {"flow"}),
    ("checks", {"checks"}),
    ("queue", {"queue"}),
    ("workflows", {"workflows"}),
    ("api", {"api"}),
    ("running", {"running"}),
    ("attempts", {"attempts"}),
    ("tasks", {"tasks"}),
    ("schedules", {"schedules"}),
    ("operations", {"operations"}),
    ("worker", {"worker"}),
    ("entry points", {"", "adopt", "apps", "urls", "admin", "management", "tracing"}),
]


def part_of(module: str) -> int:
    """The index in PARTS of ``module``'s part."""
    first = module.split(".")[1] if "." in module else ""
    for level, (_, names) in enumerate(PARTS):
        if first in names:
            return level
    raise AssertionError(f"{module} is in no part: add it to PARTS and to the map in docs/design.md")


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a part above the importer's, as "importer (part) -> imported (part)"."""
    found = []
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            if part_of(target) > part_of(name):
                found.append(f"{name} ({PARTS[part_of(name)][0]}) -> {target} ({PARTS[part_of(target)][0]})")
    return found


def test_no_part_imports_a_part_above_it():
    known = modules()
    graph = {name: imported(name, path, known, type_only_too=True) for name, path in known.items()}
    assert (
        "django_rws_jobs.flow.concurrency_keys" in graph["django_rws_jobs.queue.store"]
    )  # the reading works
    assert upward(graph) == []


def test_an_import_that_runs_up_is_found():
    graph = {
        "django_rws_jobs.database.clock": {"django_rws_jobs.models"},
        "django_rws_jobs.flow.limits": {"django_rws_jobs.queue.store", "django_rws_jobs.database.clock"},
        "django_rws_jobs.queue.store": set(),
    }
    assert upward(graph) == ["django_rws_jobs.flow.limits (flow) -> django_rws_jobs.queue.store (queue)"]


def test_a_type_checking_import_counts_for_the_parts(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..queue.store import Store\n"
    )
    known = {"django_rws_jobs.database.m": path, "django_rws_jobs.queue.store": path}
    assert imported("django_rws_jobs.database.m", path, known) == set()
    assert imported("django_rws_jobs.database.m", path, known, type_only_too=True) == {
        "django_rws_jobs.queue.store"
    }


def test_every_module_is_in_a_part():
    for name in modules():
        part_of(name)  # raises for a module of no part


def lazy_imports_without_a_reason(path: Path) -> list[int]:
    """The lines of ``path`` that import a module of the package inside a function with no reason
    in a comment on the import's last line: ``# (why)``."""
    lines = path.read_text().splitlines()
    found = []
    for function in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.ImportFrom) and (
                node.level > 0 or (node.module or "").startswith("django_rws_jobs")
            ):
                if "# (" not in lines[(node.end_lineno or node.lineno) - 1]:
                    found.append(node.lineno)
    return sorted(set(found))


def test_every_import_made_inside_a_function_says_why():
    # Lazy only for a reason that outlives a refactor (it loads the models, which some callers
    # import before the app registry is ready; an optional dependency; the process pool's
    # start-up cost), never to dodge a circle: a circle is a part in the wrong place.
    lazy = {name: lines for name, path in modules().items() if (lines := lazy_imports_without_a_reason(path))}
    assert lazy == {}


def test_a_lazy_import_without_a_reason_is_found(tmp_path):
    code = tmp_path / "m.py"
    code.write_text(
        "from .top import fine\n"
        "def f():\n"
        "    from .store import Store\n"
        "    from .models import Job  # (loads the models)\n"
        "    from django_rws_jobs.api import (\n"
        "        enqueue,\n"
        "    )\n"
        "    import json\n"
    )
    assert lazy_imports_without_a_reason(code) == [3, 5]


def vendor_branches(path: Path) -> list[int]:
    """The lines of ``path`` that compare a ``.vendor`` or look something up by it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        vendor = [n for n in ast.walk(node) if isinstance(n, ast.Attribute) and n.attr == "vendor"]
        if not vendor:
            continue
        if isinstance(node, ast.Compare) and any(n in ast.walk(node.left) for n in vendor):
            found.append(node.lineno)
        elif isinstance(node, ast.Call) and any(n in node.args for n in vendor):
            if isinstance(node.func, ast.Attribute) and node.func.attr == "get":  # hints.get(conn.vendor)
                found.append(node.lineno)
        elif isinstance(node, ast.Subscript) and node.slice in vendor:
            found.append(node.lineno)
    return found


def test_no_branch_on_the_database_vendor_outside_the_backends():
    # The database axis lives in database/backends/: what differs is a feature or a hook there.
    branches = {
        name: lines
        for name, path in modules().items()
        if not name.startswith("django_rws_jobs.database.backends") and (lines := vendor_branches(path))
    }
    assert branches == {}


def test_a_vendor_branch_is_found(tmp_path):
    code = tmp_path / "m.py"
    code.write_text(
        "x = conn.vendor == 'sqlite'\n"
        "y = {'mysql': 1}.get(conn.vendor, 0)\n"
        "z = HINTS[c.db.vendor]\n"
        "w = f'not on {conn.vendor}'\n"
    )
    assert vendor_branches(code) == [1, 2, 3]


def loaded_by_a_burst_worker(*modules: str) -> list[str]:
    """Which of ``modules`` a process has imported after django.setup() and a burst worker that
    ran one job."""
    import django_rws_jobs as rws
    from django_rws_jobs.models import Job
    from tests.conftest import run_python

    rws.enqueue("test.noop", "x")
    code = (
        "import sys\n"
        "from django.core.management import call_command\n"
        "call_command('rws_worker', burst=True, verbosity=0)\n"
        f"print('LOADED', [m for m in {list(modules)!r} if m in sys.modules])\n"
    )
    out, _ = run_python(code).communicate(timeout=120)
    assert not Job.objects.exists(), out  # the worker ran its job
    found = [line for line in out.splitlines() if line.startswith("LOADED ")]
    assert found, out
    return ast.literal_eval(found[-1].removeprefix("LOADED "))


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_without_schedules_does_not_load_croniter():
    """croniter (and dateutil with it) is imported at the first due time a schedule asks for
    (schedules/cron.py): a worker that runs no schedule keeps that memory."""
    assert loaded_by_a_burst_worker("croniter", "dateutil") == []


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_process_loads_only_the_backends_of_its_databases():
    """A vendor's backend module is imported at its database's first connection
    (database/backends/__init__.py): a worker loads its own database's backend, not the others'."""
    vendors = ("mysql", "postgresql", "sqlite")
    loaded = loaded_by_a_burst_worker(*(f"django_rws_jobs.database.backends.{v}" for v in vendors))
    assert loaded == [f"django_rws_jobs.database.backends.{connection.vendor}"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_thread_pool_worker_of_jobs_loads_neither_the_process_pool_nor_the_tasks_runner():
    """The process pool (worker/pool.py and child.py, which import multiprocessing) loads for
    ``--pool processes`` only, the runner of django.tasks rows (tasks/rows.py) at the first such
    row (queue/registry.py). (Django's SQLite backend imports multiprocessing itself.)"""
    modules = ("worker.pool", "worker.child", "tasks.rows")
    assert loaded_by_a_burst_worker(*(f"django_rws_jobs.{m}" for m in modules)) == []


def test_the_package_imports_before_the_app_registry_is_ready():
    # A project's settings or jobs.py may import it before django.setup(): the public modules
    # import what loads the models on call (running/context.py says so).
    import subprocess
    import sys

    code = (
        "import django_rws_jobs as rws\n"
        "from django.apps import apps\n"
        "assert not apps.ready\n"
        "print(rws.current_job(), rws.job, rws.JobContext.__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("None ")
