"""Intersphinx inventories of the Python and Django names the pages link to, written at build time
(Sphinx's objects.inv, version 2): the build asks no network. Add a name here to link to it."""

from __future__ import annotations

import zlib
from pathlib import Path

PYTHON = [
    ("BaseException", "py:exception", "library/exceptions.html#BaseException"),
    ("Exception", "py:exception", "library/exceptions.html#Exception"),
    ("TypeError", "py:exception", "library/exceptions.html#TypeError"),
    ("ValueError", "py:exception", "library/exceptions.html#ValueError"),
    ("SystemExit", "py:exception", "library/exceptions.html#SystemExit"),
    ("asyncio.CancelledError", "py:exception", "library/asyncio-exceptions.html#asyncio.CancelledError"),
    ("datetime.datetime", "py:class", "library/datetime.html#datetime.datetime"),
    ("datetime.timedelta", "py:class", "library/datetime.html#datetime.timedelta"),
    ("str", "py:class", "library/stdtypes.html#str"),
    ("int", "py:class", "library/functions.html#int"),
    ("float", "py:class", "library/functions.html#float"),
    ("bool", "py:class", "library/functions.html#bool"),
    ("list", "py:class", "library/stdtypes.html#list"),
    ("dict", "py:class", "library/stdtypes.html#dict"),
    ("collections.abc.Iterable", "py:class", "library/collections.abc.html#collections.abc.Iterable"),
    ("typing.Any", "py:data", "library/typing.html#typing.Any"),
    ("logging", "py:module", "library/logging.html#module-logging"),
]

DJANGO = [
    ("django.db.transaction.atomic", "py:function", "topics/db/transactions/#django.db.transaction.atomic"),
    (
        "django.db.transaction.on_commit",
        "py:function",
        "topics/db/transactions/#django.db.transaction.on_commit",
    ),
    ("django.test.override_settings", "py:function", "topics/testing/tools/#django.test.override_settings"),
    ("django.dispatch.Signal", "py:class", "topics/signals/#django.dispatch.Signal"),
    ("django.tasks", "py:module", "ref/tasks/#module-django.tasks"),
    ("DATABASES", "std:setting", "ref/settings/#std-setting-DATABASES"),
    ("INSTALLED_APPS", "std:setting", "ref/settings/#std-setting-INSTALLED_APPS"),
    ("TASKS", "std:setting", "ref/settings/#std-setting-TASKS"),
]

NAMES = {"python": ("Python", "3", PYTHON), "django": ("Django", "6.0", DJANGO)}


def write(path: Path, which: str) -> Path:
    project, version, entries = NAMES[which]
    header = (
        "# Sphinx inventory version 2\n"
        f"# Project: {project}\n# Version: {version}\n"
        "# The remainder of this file is compressed using zlib.\n"
    )
    body = "".join(f"{name} {role} 1 {uri} -\n" for name, role, uri in entries)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header.encode() + zlib.compress(body.encode()))
    return path
