"""The documentation's code runs as the pages show it: the snippets the pages include
(docs/snippets), the Prometheus rules and the metrics reference name metrics the endpoint serves,
the pages' settings, commands and checks reference is written from the code (docs/_ext), and every
code block of the pages and the README calls the API, names settings and passes command options
that exist, and the README's links are absolute, to pages and files that exist (a package index
shows it)."""

from __future__ import annotations

import ast
import re
import runpy
import sys
from pathlib import Path

import pytest
from django.core import mail
from django.db import connection
from django.test import override_settings

import django_rws_jobs as rws
from django_rws_jobs.checks import check_settings
from django_rws_jobs.database.connections import private_connection  # noqa: F401  (the app is set up)
from django_rws_jobs.models import Job
from django_rws_jobs.schedules.declared import check_schedules

DOCS = Path(__file__).resolve().parent.parent / "docs"
SNIPPETS = DOCS / "snippets"
if str(SNIPPETS) not in sys.path:
    sys.path.insert(0, str(SNIPPETS))  # the tutorial's app, ``shop``, as a project would have it

pytestmark = pytest.mark.django_db(transaction=True)


# The test that docs/howto/testing.md shows.
def test_a_receipt_is_emailed_once_the_order_commits(rf):
    from shop import jobs, views  # noqa: F401  (importing jobs.py registers the handler)

    response = views.place_order(rf.post("/order/", {"email": "ada@example.com"}))
    assert response.status_code == 202
    assert Job.objects.get().job_type == "shop.send_receipt"

    assert rws.tick(queues=["mailers"])  # runs one due job in this thread
    assert [m.to for m in mail.outbox] == [["ada@example.com"]]
    assert not Job.objects.exists()  # a job that succeeded leaves no row


def test_the_tutorials_unique_key_stores_one_job(rf):
    from shop import jobs, views  # noqa: F401

    first = views.place_order(rf.post("/order/", {"email": "bo@example.com"}))
    second = views.place_order(rf.post("/order/", {"email": "bo@example.com"}))
    assert first.content == second.content
    assert Job.objects.count() == 1


def test_the_tutorials_task_runs_and_keeps_its_result():
    """On every Django series: django.tasks on 6.x, the backport (the tasks extra) on 5.2."""
    from shop.tasks import send_receipt_task

    result = send_receipt_task.enqueue("cy@example.com")
    assert rws.tick()
    got = send_receipt_task.get_result(result.id)
    assert (got.status, got.return_value) == ("SUCCESSFUL", "cy@example.com")
    assert [m.to for m in mail.outbox] == [["cy@example.com"]]


def test_the_settings_snippet_passes_the_system_checks():
    import shop.jobs  # noqa: F401  (its schedule names shop.send_receipt)

    snippet = runpy.run_path(str(SNIPPETS / "settings.py"))
    assert "django_rws_jobs" in snippet["INSTALLED_APPS"]
    assert snippet["TASKS"]["default"]["BACKEND"] == "django_rws_jobs.tasks.RwsJobsBackend"
    with override_settings(RWS_JOBS=snippet["RWS_JOBS"]):
        assert check_settings() == []
        assert check_schedules() == []
    with override_settings(RWS_JOBS={**snippet["RWS_JOBS"], "LEASE_SECONDS": 1}):
        assert [m.id for m in check_settings()] == ["rws_jobs.E008"]  # the check can fail


def served_metrics() -> set[str]:
    """The metric names the Prometheus endpoint serves (counters with and without _total)."""
    from prometheus_client.core import CounterMetricFamily

    from django_rws_jobs.operations.prometheus import QueueCollector

    names = set()
    for family in QueueCollector("default").collect():
        names.add(family.name)
        if isinstance(family, CounterMetricFamily):
            names.add(family.name + "_total")
    return names


#: The database names the metrics reference gives in "only on ...", per Django vendor.
DATABASE_NAMES = {"postgresql": "PostgreSQL", "mysql": "MariaDB", "sqlite": "SQLite"}


def listed_metrics() -> tuple[set[str], set[str]]:
    """The metrics the reference lists: (served on this database, served only on others)."""
    page = (DOCS / "reference" / "metrics.md").read_text()
    here, elsewhere = set(), set()
    for line in page.splitlines():
        if line.startswith("| `rws_"):
            names = set(re.findall(r"`(rws_[a-z0-9_]+)`", line.split(" | ")[0]))
            only = re.search(r"only on ([A-Za-z ]+?):", line)
            mine = only is None or DATABASE_NAMES[connection.vendor] in only.group(1)
            (here if mine else elsewhere).update(names)
    return here, elsewhere


def test_the_alerting_rules_name_metrics_that_are_served():
    rules = (SNIPPETS / "prometheus-rules.yml").read_text()
    named = set(re.findall(r"\b(rws_[a-z0-9_]+)\b", rules)) - {"rws_jobs"}  # (the group's name)
    served = served_metrics() | listed_metrics()[1]
    assert named and named <= served, named - served


def test_the_metrics_reference_lists_every_served_metric():
    listed, elsewhere = listed_metrics()
    served = {n for n in served_metrics() if not any(n + "_total" == m for m in served_metrics())}
    assert listed == served
    assert elsewhere and not elsewhere & served


def test_help_texts_name_each_default_and_its_setting(settings):
    """The commands' help (and the generated commands page) gives each default's value, and a
    setting's full name with its value now."""
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import rws_reference
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    settings.RWS_JOBS = {**settings.RWS_JOBS, "POLL_INTERVAL": 0.25}
    commands = rws_reference.commands_page()
    worker = commands[commands.index("## rws_worker") :]

    def row(flag: str) -> str:
        return next(line for line in worker.splitlines() if line.startswith(f"| `{flag}"))

    assert "(default: RWS_JOBS['POLL_INTERVAL'], now 0.25)" in row("--poll-interval")
    assert "(default: every queue)" in row("--queues")
    assert "(default: threads)" in row("--pool")
    assert "`--reload`" in worker
    for name in ("rws_worker", "rws_health", "rws_queues", "rws_schedules", "rws_prune_task_results"):
        page = commands[commands.index(f"## {name}\n") :]
        database = next(line for line in page.splitlines() if line.startswith("| `--database`"))
        assert "(default: RWS_JOBS['DATABASE'], now 'default')" in database, name


def test_the_reference_writer_reads_every_setting_and_command():
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import rws_reference
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    from django_rws_jobs.conf import DEFAULTS

    settings_page = rws_reference.settings_page()
    for key in DEFAULTS:
        row = next(line for line in settings_page.splitlines() if line.startswith(f"| `{key}` |"))
        assert row.split("|")[5].strip(), f"conf.py has no comment above {key}"
    commands = rws_reference.commands_page()
    for name in ("rws_worker", "rws_health", "rws_queues", "rws_schedules", "rws_prune_task_results"):
        assert f"## {name}\n" in commands
    assert "`--heartbeat-file`" in commands and "`--max-due-age`" in commands
    checks = rws_reference.checks_page()
    assert all(f"`rws_jobs.E{n:03d}`" in checks for n in (1, 8, 18, 24, 25, 101, 105))


# Every code block of the pages and the README: a renamed function, keyword, setting or command
# option breaks one of these tests, not a reader.

BLOCK = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.S | re.M)
PAGES = [p for p in DOCS.rglob("*.md") if "_build" not in p.parts] + [DOCS.parent / "README.md"]


def blocks(language: str) -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for lang, body in BLOCK.findall(page.read_text()):
            if lang == language:
                found.append((str(page.relative_to(DOCS.parent)), body))
    return found


def python_source(body: str) -> str:
    """A block's code, without the interpreter's prompts and what it printed."""
    if ">>> " not in body:
        return body
    return "\n".join(line[4:] for line in body.splitlines() if line.startswith((">>> ", "... ")))


def test_the_pages_python_blocks_parse():
    assert len(blocks("python")) > 15
    for page, body in blocks("python"):
        try:
            ast.parse(python_source(body))
        except SyntaxError as exc:
            raise AssertionError(f"{page}: {exc}\n{body}") from None


def public_calls(tree: ast.AST) -> list[tuple[str, list[str]]]:
    """(name, keywords) of each call of the public API: ``rws.name(...)``, or a public name (imported
    from django_rws_jobs or not), as a call or a decorator."""
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "django_rws_jobs"
        for alias in node.names
    } | set(rws.__all__)  # a block may leave its imports out
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "rws":
            name = func.attr
        elif isinstance(func, ast.Name) and func.id in imported:
            name = func.id
        else:
            continue
        calls.append((name, [k.arg for k in node.keywords if k.arg]))
    return calls


def test_the_pages_call_the_api_as_it_is():
    import inspect

    checked = 0
    for page, body in blocks("python"):
        for name, keywords in public_calls(ast.parse(python_source(body))):
            assert hasattr(rws, name), f"{page}: django_rws_jobs has no {name}"
            params = inspect.signature(getattr(rws, name)).parameters
            if any(p.kind is p.VAR_KEYWORD for p in params.values()):
                continue
            unknown = set(keywords) - set(params)
            assert not unknown, f"{page}: {name}() takes no {sorted(unknown)}"
            checked += 1
    assert checked > 5


def test_the_pages_settings_are_real():
    from django_rws_jobs.conf import DEFAULTS

    seen_keys = 0
    for page, body in blocks("python"):
        for node in ast.walk(ast.parse(python_source(body))):
            if (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "RWS_JOBS" for t in node.targets)
                and isinstance(node.value, ast.Dict)
            ):
                keys = {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
                assert keys <= set(DEFAULTS), f"{page}: RWS_JOBS has no {sorted(keys - set(DEFAULTS))}"
                seen_keys += len(keys)
    assert seen_keys > 5


def test_the_pages_command_options_are_real():
    from django.core.management import load_command_class

    commands = ("rws_worker", "rws_health", "rws_queues", "rws_schedules", "rws_prune_task_results")
    options = {
        name: {
            o
            for a in load_command_class("django_rws_jobs", name).create_parser("", name)._actions
            for o in a.option_strings
        }
        for name in commands
    }
    checked = 0
    for page, body in [*blocks("sh"), *blocks("yaml"), *blocks("ini")]:
        for line in body.splitlines():
            code = line.split(" #")[0]
            name = next((c for c in commands if c in code.split() or f'"{c}"' in code), None)
            if name is None:
                continue
            flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", code.split(name, 1)[1]))
            unknown = flags - options[name]
            assert not unknown, f"{page}: {name} has no {sorted(unknown)}: {line}"
            checked += len(flags)
    assert checked > 10


# The README is the package's page on an index, where a relative link leads nowhere: each link is
# absolute, into the hosted documentation (a page of docs/) or to a file of the repository.

LINK = re.compile(r"\]\(([^)\s]+)\)")


def project_urls() -> dict[str, str]:
    """pyproject.toml's [project.urls] (read as text: Python 3.10 has no tomllib)."""
    text = (DOCS.parent / "pyproject.toml").read_text()
    section = text.split("\n[project.urls]\n", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^(\w+) = "([^"]+)"$', section, re.M))


def docs_page(url: str, docs_url: str) -> Path:
    """The page of docs/ that a link into the hosted documentation shows."""
    path = url.removeprefix(docs_url).split("#")[0]
    name = path.removesuffix(".html") if path.endswith(".html") else path + "index"
    return DOCS / f"{name}.md"


def test_the_readme_links_work_on_a_package_index():
    urls = project_urls()
    docs_url, source = urls["Documentation"], urls["Source"]
    assert docs_url == "https://django-rws-jobs.readthedocs.io/en/latest/"  # .readthedocs.yaml's build
    assert urls["Issues"] == f"{source}/issues"
    assert docs_page(urls["Changelog"], docs_url).is_file()
    raw = source.replace("https://github.com/", "https://raw.githubusercontent.com/") + "/main/"
    links = LINK.findall((DOCS.parent / "README.md").read_text())
    assert len(links) > 20
    for link in links:
        if link.startswith(docs_url):
            assert docs_page(link, docs_url).is_file(), f"README.md: {link} is no page of docs/"
        elif link.startswith(raw):
            assert (DOCS.parent / link.removeprefix(raw)).is_file(), f"README.md: {link} is no file"
        else:
            assert link.startswith("https://"), f"README.md: {link} is relative"
    assert any(link.startswith(raw) and link.endswith(".png") for link in links)  # the screenshot
