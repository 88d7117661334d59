"""Database plumbing: connections, their set-up (by their backend) and short transactions."""

from __future__ import annotations

import logging
import threading
from contextlib import AbstractContextManager
from typing import Any

from django.db import InterfaceError, InternalError, OperationalError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from ..conf import jobs_settings
from .backends import backend_for
from .backends.base import is_registered
from .deadline import remember_socket

logger = logging.getLogger("django_rws_jobs")

_thread = threading.local()


def thread_connected() -> bool:
    """True once the calling thread has opened a database connection (Django's or a private one).

    A worker's executor thread asks this after each job: while its handlers never touched the
    database there is nothing for ``close_old_connections()`` to look at, and skipping it saves
    most of a no-op job's cost.
    """
    return getattr(_thread, "connected", False)


def configure_connection(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """Set up new connections as their database's backend says (backends.*.configure_session)."""
    _thread.connected = True
    if getattr(connection, "rws_private", False):
        remember_socket(connection)
    backend_for(connection).configure_session()


def before_first_connections() -> None:
    """backends.*.before_first_connection for the main thread's connection to the queue's alias
    and to those RWS_JOBS["SQLITE_SETUP_ALIASES"] names (AppConfig.ready)."""
    extra = jobs_settings.SQLITE_SETUP_ALIASES
    aliases = [jobs_settings.DATABASE, *(extra if isinstance(extra, (list, tuple)) else ())]
    for alias in dict.fromkeys(aliases):
        if isinstance(alias, str) and alias in connections.settings:
            backend_for(connections[alias]).before_first_connection()


def queue_alias(using: str | None = None) -> str:
    alias = using if using is not None else jobs_settings.DATABASE
    if not isinstance(alias, str) or alias not in connections.settings:
        raise ValueError(
            f"database alias {alias!r} is not in DATABASES (known: {', '.join(connections.settings)})"
        )
    return alias


def private_connection(alias: str) -> BaseDatabaseWrapper:
    """A connection of our own to ``alias``, outside Django's per-thread handling.

    ``close_old_connections()`` around a job never closes it, so the worker's bookkeeping does not
    reconnect for every job.
    """
    conn = connections.create_connection(alias)
    options = backend_for(conn).private_options(dict(conn.settings_dict.get("OPTIONS", {})))
    conn.settings_dict = {**conn.settings_dict, "OPTIONS": options}
    conn.rws_private = True  # see configure_connection
    return conn


def sends_several(conn: BaseDatabaseWrapper) -> bool:
    """MariaDB/MySQL: whether ``conn``'s driver connection accepts several statements in one call
    (see backends.mysql.sends_several)."""
    from .backends.mysql import sends_several  # (MariaDB's backend: loaded for its databases only)

    return sends_several(conn)


def write_lock(conn: BaseDatabaseWrapper) -> AbstractContextManager[Any]:
    """What the worker's private connections hold around their writes (see SQLiteBackend.write_lock)."""
    return backend_for(conn).write_lock()


def atomic(
    conn: BaseDatabaseWrapper, *, write: bool = True, cursor: Any = None
) -> AbstractContextManager[None]:
    """A short transaction on ``conn`` (see BaseBackend.atomic)."""
    return backend_for(conn).atomic(write=write, cursor=cursor)


#: MySQL/MariaDB error numbers that retrying cannot fix: access denied (1044, 1045, 1142, 1143,
#: 1227), no database (1046, 1049), an unknown table or column (1054, 1146), a syntax error (1064,
#: 1149); a value the column refuses: a string its character set cannot hold (1366, 1300),
#: truncated or wrong values (1265, 1292), collations that do not mix (1267, 1270, 1271), and a
#: trigger's SIGNAL (1644). Most reach Python (mysqlclient) as OperationalError, like a lost
#: connection (tests/test_faults.py::test_an_outcome_the_database_refuses_is_recorded_plainly).
MYSQL_PERMANENT = frozenset(
    {1044, 1045, 1046, 1049, 1054, 1064, 1142, 1143, 1146, 1149, 1227}
    | {1265, 1267, 1270, 1271, 1292, 1300, 1366, 1644}
)
#: SQLite result codes (the low byte) that retrying cannot fix: SQLITE_ERROR (a missing table or
#: column, a syntax error), SQLITE_READONLY, SQLITE_CORRUPT, SQLITE_NOTADB, SQLITE_AUTH.
SQLITE_PERMANENT = frozenset({1, 8, 11, 23, 26})
#: The same, told by their messages where Python (before 3.11) gives no result code.
SQLITE_PERMANENT_MESSAGES = (
    "no such table",
    "no such column",
    "syntax error",
    "has no column named",
    "attempt to write a readonly database",
    "file is not a database",
    "database disk image is malformed",
    "not authorized",
)


def is_transient(exc: BaseException) -> bool:
    """True for a database error that may pass by itself: a lost connection, a server that
    restarts, a lock or deadlock timeout. False for one that retrying cannot fix: a missing table
    or column, a syntax error, a permission, a value the database refuses (DataError,
    IntegrityError). Pinned by tests/test_faults.py::test_error_kinds."""
    if isinstance(exc, (InterfaceError, InternalError)):
        return True  # a closed connection; PostgreSQL's aborted transaction (reconnecting ends it)
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__
    code = getattr(cause, "args", (None,))[0] if cause is not None else None
    if type(cause).__module__.startswith(("MySQLdb", "pymysql")) and isinstance(code, int):
        return code not in MYSQL_PERMANENT
    sqlite_code = getattr(cause, "sqlite_errorcode", None)
    if isinstance(sqlite_code, int):
        return sqlite_code & 0xFF not in SQLITE_PERMANENT
    message = str(exc).lower()
    return not any(m in message for m in SQLITE_PERMANENT_MESSAGES)


__all__ = [
    "atomic",
    "configure_connection",
    "is_registered",
    "is_transient",
    "private_connection",
    "queue_alias",
    "sends_several",
    "thread_connected",
    "write_lock",
]
