"""Reference pages written from the code at build time, so they cannot drift from it:
``reference/generated/settings.md`` (conf.DEFAULTS, the comments above each key in conf.py, and
checks.RULES), ``commands.md`` (each management command's argparse parser) and ``checks.md``
(every system check id, found in the package's source)."""

from __future__ import annotations

import ast
import io
import pkgutil
import re
from pathlib import Path
from typing import Any

from django.core.management import load_command_class

import django_rws_jobs

PACKAGE = Path(django_rws_jobs.__file__).resolve().parent
#: The options every Django command has; the commands page lists each command's own.
DJANGO_OPTIONS = {
    "help",
    "version",
    "verbosity",
    "settings",
    "pythonpath",
    "traceback",
    "no_color",
    "force_color",
    "skip_checks",
}
#: Settings whose rules are not one RULES entry: where their checks live.
OTHER_RULES = {
    "QUEUES": ("rws_jobs.E018-E020", 'queue -> {"concurrency": N, "rate_limit": "N/s" | "N/m" | "N/h"}'),
}


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def setting_comments() -> dict[str, str]:
    """The comment lines just above each key of DEFAULTS in conf.py, joined."""
    lines = (PACKAGE / "conf.py").read_text().splitlines()
    found: dict[str, str] = {}
    pending: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r'"([A-Z_]+)":', stripped)
        if match:
            found[match.group(1)] = " ".join(pending)
        pending = []
    return found


def settings_page() -> str:
    from django_rws_jobs.checks import RULES
    from django_rws_jobs.conf import DEFAULTS

    comments = setting_comments()
    out = io.StringIO()
    out.write("| setting | default | what it must be | check | what it does |\n|---|---|---|---|---|\n")
    for key, default in DEFAULTS.items():
        if key in RULES:
            check_id, _, must = RULES[key]
        else:
            check_id, must = OTHER_RULES[key]
        if key == "SCHEDULES":
            check_id += ", rws_jobs.E101-E105"
        out.write(
            f"| `{key}` | `{default!r}` | {cell(must)} | `{check_id}` | {cell(comments.get(key, ''))} |\n"
        )
    return out.getvalue()


def _help(parser: Any, action: Any) -> str:
    if not action.help:
        return ""
    return parser._get_formatter()._expand_help(action)


def commands_page() -> str:
    names = sorted(m.name for m in pkgutil.iter_modules([str(PACKAGE / "management" / "commands")]))
    out = io.StringIO()
    for name in names:
        command = load_command_class("django_rws_jobs", name)
        parser = command.create_parser("manage.py", name)
        out.write(f"## {name}\n\n{command.help.strip()}\n\n")
        usage = parser.format_usage().replace("usage: ", "").strip()
        out.write(f"```text\n{usage}\n```\n\n")
        rows = [a for a in parser._actions if a.dest not in DJANGO_OPTIONS]
        if rows:
            out.write("| option | default | what it does |\n|---|---|---|\n")
            for action in rows:
                flags = ", ".join(action.option_strings) or action.dest
                default = (
                    ""
                    if action.default in (None, False) or action.option_strings == []
                    else f"`{action.default}`"
                )
                out.write(f"| `{flags}` | {default} | {cell(_help(parser, action))} |\n")
            out.write("\n")
    return out.getvalue()


CHECK_ID = re.compile(r"^rws_jobs\.[EW]\d{3}$")
#: A check described in a docstring's list: "- ``rws_jobs.E101``: the cron expression is invalid;"
DESCRIBED = re.compile(r"``(rws_jobs\.[EW]\d{3})``: (.+?)[;.]?(?=\n\s*- ``|\n\s*\n|\Z)", re.S)


def checks_page() -> str:
    """Every check id in the package's source, with what it reports: the docstring's words where
    a docstring lists it, else the settings rule's bounds (checks.RULES), else the message the
    code builds."""
    from django_rws_jobs.checks import RULES

    where: dict[str, str] = {}
    words: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        source = path.read_text()
        tree = ast.parse(source)
        here = path.relative_to(PACKAGE.parent).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if CHECK_ID.match(node.value):
                    where.setdefault(node.value, here)
                for check_id, text in DESCRIBED.findall(node.value):
                    words.setdefault(check_id, " ".join(text.split()).rstrip(";."))
            if isinstance(node, ast.Call) and node.args:
                for keyword in node.keywords:
                    value = keyword.value
                    if (
                        keyword.arg == "id"
                        and isinstance(value, ast.Constant)
                        and CHECK_ID.match(str(value.value))
                    ):
                        words.setdefault(
                            value.value, "the message: `" + cell(ast.unparse(node.args[0])) + "`"
                        )
    for key, (check_id, _, must) in RULES.items():
        words[check_id] = f"`RWS_JOBS[{key!r}]` is not {must}"
    out = io.StringIO()
    out.write("| check | what it reports | where |\n|---|---|---|\n")
    for check_id in sorted(where):
        out.write(f"| `{check_id}` | {cell(words.get(check_id, ''))} | `{where[check_id]}` |\n")
    return out.getvalue()


def write_pages(app: Any) -> None:
    target = Path(app.srcdir) / "reference" / "generated"
    target.mkdir(parents=True, exist_ok=True)
    for name, make in (("settings", settings_page), ("commands", commands_page), ("checks", checks_page)):
        text = make()
        path = target / f"{name}.md"
        if not path.exists() or path.read_text() != text:  # unchanged files keep Sphinx's cache
            path.write_text(text)


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", write_pages)
    return {"parallel_read_safe": True, "version": "1"}
