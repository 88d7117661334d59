"""One backend per database (as Django's ``django/db/backends/<vendor>/``): its features, its
statements and its session set-up. Nothing outside this package asks which database it runs on.

``backend_for(conn)`` is called on hot paths (claims, completions, enqueue): the backend is made
once per connection and kept on it.
"""

from __future__ import annotations

from django.db.backends.base.base import BaseDatabaseWrapper

from .base import BaseBackend, BaseFeatures
from .claimed import Claimed
from .mysql import MySQLBackend
from .postgresql import PostgreSQLBackend
from .sqlite import SQLiteBackend
from .statements import Sql

#: The backend class per Django vendor; other databases get the base backend's standard SQL.
BACKENDS: dict[str, type[BaseBackend]] = {
    "sqlite": SQLiteBackend,
    "postgresql": PostgreSQLBackend,
    "mysql": MySQLBackend,
}


def backend_for(conn: BaseDatabaseWrapper) -> BaseBackend:
    """The backend of the Django connection ``conn``. A copy of a connection (``copy.copy``,
    Django's ``connection.copy()``) carries its original's attribute: it gets its own."""
    backend = getattr(conn, "rws_backend", None)
    if backend is None or backend.conn is not conn:
        backend = conn.rws_backend = BACKENDS.get(conn.vendor, BaseBackend)(conn)
    return backend


__all__ = ["BaseBackend", "BaseFeatures", "Claimed", "Sql", "backend_for"]
