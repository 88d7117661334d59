"""Deadlines for the worker's statements: a statement that has not answered within
``RWS_JOBS["STATEMENT_DEADLINE"]`` seconds means its connection is dead.

TCP's own timers (keepalives, ``tcp_user_timeout``, read timeouts) notice a peer that vanished, but
not one that acknowledges bytes and never answers: a hung pooler or proxy. The worker's statements
are short, so one watcher thread per process looks at the statements under way every
:data:`TICK` seconds and shuts down the socket of one past its deadline. The blocked driver call
then fails as a lost connection, and ``reconnect.Retry`` opens a new one (docs/design.md, "Dead
connections").

A watch costs two attribute writes and a clock read: it is kept off the claim path's budget.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from ..conf import jobs_settings

logger = logging.getLogger("django_rws_jobs")

#: Seconds between the watcher's looks.
TICK = 0.5


class Watch:
    """One thread's statements on one connection: ``start()`` before, ``done()`` after."""

    __slots__ = ("__weakref__", "conn", "fd", "raw", "since", "uncut", "what")

    def __init__(self) -> None:
        self.conn: BaseDatabaseWrapper | None = None
        self.raw: Any = None  # the driver connection whose socket is ``fd``
        self.fd: int | None = None
        self.since = 0.0  # time.monotonic() of the statement under way; 0.0: none
        self.what = ""
        self.uncut = False  # the watcher found this statement late and could not cut it yet

    def start(self, conn: BaseDatabaseWrapper, what: str) -> None:
        self.conn, self.what = conn, what
        raw = conn.connection
        if raw is not self.raw:
            # Asked here, in the thread that owns the connection: mysqlclient refuses fileno()
            # to another thread while a statement is under way.
            self.raw, self.fd = raw, (socket_of(raw) if raw is not None else None)
        self.since = time.monotonic()
        self.uncut = False

    def done(self) -> None:
        self.since = 0.0


_watches: weakref.WeakSet[Watch] = weakref.WeakSet()  # a Watch goes with its Retry
_lock = threading.Lock()
_thread: threading.Thread | None = None


def watch() -> Watch:
    """A new Watch, looked at by the process's watcher thread (started on first use)."""
    global _thread
    w = Watch()
    with _lock:
        _watches.add(w)
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_run, name="rws-deadlines", daemon=True)
            _thread.start()
    return w


def socket_of(raw: Any) -> int | None:
    """The file descriptor of a driver connection's socket (psycopg, mysqlclient, PyMySQL), or
    None where it has none (SQLite)."""
    fileno = getattr(raw, "fileno", None)
    if fileno is None:
        sock = getattr(raw, "_sock", None)  # PyMySQL
        fileno = getattr(sock, "fileno", None)
    if fileno is None:
        return None
    try:
        fd = fileno()
    except Exception:  # noqa: BLE001  (a closed connection has none)
        return None
    return fd if isinstance(fd, int) and fd >= 0 else None


def remember_socket(conn: BaseDatabaseWrapper) -> None:
    """Keep the socket of a connection just opened, asked in the thread that opened it (the
    connection_created signal): a call watched since before its connection was opened can then
    still be cut, although mysqlclient refuses fileno() to the watcher's thread while the call
    is under way (tests/test_dead_connections.py::test_a_call_watched_from_before_its_connect_can_be_cut)."""
    raw = conn.connection
    conn.rws_socket = (raw, socket_of(raw) if raw is not None else None)


def cut(conn: BaseDatabaseWrapper, known: Watch | None = None) -> bool:
    """Shut down ``conn``'s socket, so that a call blocked on it fails at once. True if cut.
    ``known`` gives the socket as its owner found it, if that is still the connection's; else the
    socket remembered when the connection was opened (remember_socket)."""
    raw = conn.connection
    remembered = getattr(conn, "rws_socket", (None, None))
    if known is not None and raw is not None and raw is known.raw and known.fd is not None:
        fd: int | None = known.fd
    elif raw is not None and raw is remembered[0] and remembered[1] is not None:
        fd = remembered[1]
    else:
        fd = socket_of(raw) if raw is not None else None
    if fd is None:
        return False
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    try:
        s.shutdown(socket.SHUT_RDWR)  # acts on the socket itself, which the driver shares
    except OSError:
        pass
    finally:
        s.close()
    return True


def _run() -> None:
    while True:
        time.sleep(TICK)
        limit = jobs_settings.STATEMENT_DEADLINE
        if not limit:
            continue
        now = time.monotonic()
        with _lock:
            late = [w for w in _watches if w.since and now - w.since > limit]
        for w in late:
            since, conn = w.since, w.conn
            if not since or now - since <= limit or conn is None:
                continue  # it answered meanwhile
            if cut(conn, w):
                logger.warning(
                    "no answer from the database within %ss while %s: the connection is taken for "
                    "dead and closed",
                    limit,
                    w.what,
                )
                w.since = 0.0
            elif not w.uncut:  # no socket to cut yet (a connect under way): tried again each TICK
                w.uncut = True
                logger.warning(
                    "no answer from the database within %ss while %s, and no socket to close yet",
                    limit,
                    w.what,
                )


__all__ = ["TICK", "Watch", "cut", "socket_of", "watch"]
