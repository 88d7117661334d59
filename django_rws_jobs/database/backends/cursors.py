"""Cursors of the queue's own: the driver's, on a worker's connections, and one kept for enqueue."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

#: Django's placeholder (``%%s`` is a literal ``%s``).
PLACEHOLDER = re.compile(r"(?<!%)%s")


@functools.lru_cache(maxsize=512)
def qmark(sql: str) -> str:
    """Django's ``%s`` placeholders as sqlite3's ``?`` (what Django's SQLite cursor does for
    every statement; the worker's few statements are converted once each)."""
    return PLACEHOLDER.sub("?", sql).replace("%%", "%")


class DriverCursor:
    """The driver's cursor of a worker's own connection, taking Django's placeholders.

    Django's cursor wrapper (its query conversion, its query-log check and a new error wrapper for
    every fetch) costs more than the SQLite statements it runs for a claim. A worker's own
    connections run only the Store's statements, so they use the driver's cursor. As a context
    manager (what Store.cursor returns) it turns the driver's errors into Django's, as
    ``wrap_database_errors`` does.
    """

    __slots__ = ("_errors", "_sqlite", "cursor")

    def __init__(self, cursor: Any, sqlite: bool, errors: Any):
        self.cursor = cursor
        self._sqlite = sqlite
        self._errors = errors

    def __enter__(self) -> DriverCursor:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Any:
        return self._errors.__exit__(exc_type, exc, tb)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.cursor.execute(qmark(sql) if self._sqlite else sql, params)

    def fetchone(self) -> Any:
        return self.cursor.fetchone()

    def fetchall(self) -> Any:
        return self.cursor.fetchall()

    @property
    def rowcount(self) -> int:
        return self.cursor.rowcount


def kept_cursor(conn: Any) -> Any:
    """A cursor kept on ``conn`` for enqueue's INSERT, made as ``conn.cursor()`` makes one.

    ``cursor()`` builds a new driver cursor and Django's wrapper around it every time, a large
    part of enqueue's time in the client (docs/benchmarks.md). The kept one is Django's own
    wrapper, so ``execute_wrapper`` and error translation still apply; while Django logs queries
    (DEBUG, ``assertNumQueries``) there is none (None: take a new cursor, which logs). It is
    replaced when Django reconnects.
    """
    if conn.queries_logged:
        return None
    conn.close_if_health_check_failed()
    conn.ensure_connection()
    conn.validate_thread_sharing()
    kept = getattr(conn, "_rws_insert_cursor", None)
    if kept is None or kept[0] is not conn.connection:
        with conn.wrap_database_errors:
            kept = (conn.connection, conn.make_cursor(conn.create_cursor()))
        conn._rws_insert_cursor = kept
    return kept[1]
