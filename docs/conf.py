"""Sphinx configuration of the documentation site (scripts/docs builds it)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE / "_ext"), str(HERE / "snippets")]

import django  # noqa: E402
from django.conf import settings  # noqa: E402

# autodoc imports the package, and the reference pages read its settings, checks and commands:
# Django is set up on an in-memory SQLite database, which nothing here writes to.
settings.configure(
    INSTALLED_APPS=[
        "django.contrib.admin",
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django.contrib.sessions",
        "django.contrib.messages",
        "django_rws_jobs",
    ],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    USE_TZ=True,
)
django.setup()

import inventories  # noqa: E402

import django_rws_jobs  # noqa: E402

project = "django-rws-jobs"
author = "the django-rws-jobs developers"
copyright = "the django-rws-jobs developers"
release = "0.1.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.intersphinx",
    "sphinx_copybutton",
    "rws_reference",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_ext", "snippets/README.md", "Thumbs.db", ".DS_Store"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 4
suppress_warnings = ["myst.header"]  # the archive pages start at a second-level heading

html_theme = "furo"
html_title = "django-rws-jobs"
html_static_path: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "description"

# No network at build time: the inventories of Python's and Django's docs that the pages link to
# are written from docs/_ext/inventories.py (the names used, with their real addresses).
intersphinx_mapping = {
    "python": (
        "https://docs.python.org/3/",
        str(inventories.write(HERE / "_build" / "python.inv", "python")),
    ),
    "django": (
        "https://docs.djangoproject.com/en/6.0/",
        str(inventories.write(HERE / "_build" / "django.inv", "django")),
    ),
}
intersphinx_disabled_reftypes = ["*"]

# linkcheck: links between the pages and their anchors; the outside world is not asked.
linkcheck_ignore = [r"^https?://"]
linkcheck_anchors = True

assert django_rws_jobs.__all__  # the package imported
