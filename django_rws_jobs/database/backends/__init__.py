"""One backend per database (as Django's ``django/db/backends/<vendor>/``): its features, its
statements and its session set-up. Nothing outside this package asks which database it runs on.

``backend_for(conn)`` is called on hot paths (claims, completions, enqueue): the backend is made
once per connection and kept on it. A vendor's module is imported at its first connection, so a
process loads only the backends of the databases it uses
(tests/test_imports.py::test_a_process_loads_only_the_backends_of_its_databases).
"""

from __future__ import annotations

from importlib import import_module

from django.db.backends.base.base import BaseDatabaseWrapper

from .base import BaseBackend, BaseFeatures
from .claimed import Claimed
from .statements import Sql

#: The backend class per Django vendor (its module here, its name); other databases get the base
#: backend's standard SQL.
BACKENDS = {
    "sqlite": ("sqlite", "SQLiteBackend"),
    "postgresql": ("postgresql", "PostgreSQLBackend"),
    "mysql": ("mysql", "MySQLBackend"),
}


def backend_class(vendor: str) -> type[BaseBackend]:
    """The backend class of Django's ``vendor``, its module imported at the first call."""
    found = BACKENDS.get(vendor)
    if found is None:
        return BaseBackend
    module, name = found
    cls: type[BaseBackend] = getattr(import_module(f".{module}", __name__), name)
    return cls


def backend_for(conn: BaseDatabaseWrapper) -> BaseBackend:
    """The backend of the Django connection ``conn``. A copy of a connection (``copy.copy``,
    Django's ``connection.copy()``) carries its original's attribute: it gets its own."""
    backend = getattr(conn, "rws_backend", None)
    if backend is None or backend.conn is not conn:
        backend = conn.rws_backend = backend_class(conn.vendor)(conn)
    return backend


__all__ = ["BaseBackend", "BaseFeatures", "Claimed", "Sql", "backend_class", "backend_for"]
