"""MariaDB/MySQL inserts: statements within the server's packet size, quoted and pipelined rows."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from .inserts import INSERT_HEAD, INSERT_SQL, INSERT_VALUES, insert_rows

#: The characters MariaDB/MySQL quoting escapes (one byte more each), whatever the driver.
_ESCAPED = re.compile(r"[\x00\n\r\\'\"\x1a]")


def max_statement_bytes(conn: Any) -> int:
    """The longest statement the server takes (its ``max_allowed_packet`` less the packet's
    command byte), read once per driver connection."""
    conn.ensure_connection()
    kept = getattr(conn, "_rws_max_packet", None)
    if kept is None or kept[0] is not conn.connection:
        with conn.cursor() as c:
            c.execute("SELECT @@max_allowed_packet")
            kept = (conn.connection, int(c.fetchone()[0]) - 1)
        conn._rws_max_packet = kept
    return kept[1]


def sized_batches(
    rows: Iterator[Any], size: int, budget: int, nbytes: Callable[[Any], int], where: Callable[[], str]
) -> Iterator[list[Any]]:
    """Batches of at most ``size`` rows whose values (``nbytes(row)`` each, and a separator) take
    at most ``budget`` bytes: MariaDB refuses a statement longer than its max_allowed_packet, and
    with it the whole batch (test_enqueue_many_splits_statements_by_the_servers_packet_limit)."""
    chunk: list[Any] = []
    used = 0
    for row in rows:
        n = nbytes(row) + 2
        if n > budget:
            raise ValueError(f"{where()}: {_too_big(len(INSERT_HEAD) + n, len(INSERT_HEAD) + budget)}")
        if chunk and (len(chunk) >= size or used + n > budget):
            yield chunk
            chunk, used = [], 0
        chunk.append(row)
        used += n
    if chunk:
        yield chunk


def _too_big(n: int, limit: int) -> str:
    return (
        f"its INSERT statement is about {n:,} bytes; the server's max_allowed_packet allows "
        f"statements of {limit:,} bytes (store large payloads elsewhere, or raise the limit)"
    )


def _literal_bytes(value: Any) -> int:
    """An upper bound on the length of ``value`` quoted as a MariaDB/MySQL literal."""
    if isinstance(value, str):
        return len(value.encode()) + len(_ESCAPED.findall(value)) + 2
    return 4 if value is None else len(str(value))


def _row_bytes(row: list[Any]) -> int:
    return len(INSERT_VALUES) + sum(_literal_bytes(v) for v in row)


def check_insert_size(conn: Any, params: list[Any], what: str) -> None:
    """Refuse a job whose INSERT the server would refuse for its size. (The server's answer, error
    1153, also drops the connection, and the caller's transaction with it.)"""
    # A bound first, cheap to compute: at most 4 bytes a character as UTF-8, 20 a number.
    rough = len(INSERT_SQL) + sum(4 * len(v) + 2 if isinstance(v, str) else 20 for v in params)
    if rough < 1024 or rough <= (limit := max_statement_bytes(conn)):  # (no server takes less than 1 KiB)
        return
    n = len(INSERT_HEAD) + _row_bytes(params)
    if n > limit:
        raise ValueError(f"{what}: {_too_big(n, limit)}")


def insert_sized(
    conn: Any, c: Any, rows: Iterator[list[Any]], batch_size: int, where: Callable[[], str]
) -> None:
    """Multi-row INSERTs through the cursor ``c``, each within the server's packet size."""
    budget = max_statement_bytes(conn) - len(INSERT_HEAD)
    for chunk in sized_batches(rows, batch_size, budget, _row_bytes, where):
        insert_rows(c, chunk)


def pipelines(raw: Any) -> bool:
    """Whether the driver connection ``raw`` can send a statement and read its answer later,
    quoting values to bytes (mysqlclient; PyMySQL takes the plain path)."""
    return hasattr(raw, "send_query") and hasattr(raw, "read_query_result") and hasattr(raw, "literal")


def _quoted_rows(
    literal: Callable[[Any], bytes], rows: Iterator[list[Any]], batch_size: int
) -> Iterator[bytes]:
    """Each row's VALUES tuple, quoted by the driver's ``literal``, each distinct value once a
    batch: the rows of one call mostly repeat the same job type, payload, queue, due time and
    limits. The ids are our own UUIDs (hex digits and dashes), which need no escaping."""
    tail_format = INSERT_VALUES.encode().replace(b"(%s, ", b"', ", 1)  # the row after its id
    quoted: dict[tuple[type, Any], bytes] = {}
    tails: dict[tuple[Any, ...], bytes] = {}
    for job_id, *rest in rows:
        if len(tails) > batch_size:  # remember a batch's worth of distinct values
            quoted.clear()
            tails.clear()
        key = tuple(rest)
        tail = tails.get(key)
        if tail is None:
            parts = []
            for v in rest:
                q = quoted.get((type(v), v))
                if q is None:
                    q = quoted[(type(v), v)] = literal(v)
                parts.append(q)
            tail = tails[key] = tail_format % tuple(parts)
        yield b"('" + job_id.encode() + tail


def insert_quoted(
    conn: Any, raw: Any, rows: Iterator[list[Any]], batch_size: int, where: Callable[[], str]
) -> None:
    """Multi-row INSERTs whose values are quoted here (see _quoted_rows): mysqlclient would quote
    every parameter of every row, most of a bulk enqueue's time in the client.

    The statements are pipelined: each is sent, and the next batch is validated and built while
    the server inserts the rows of the one before (the driver lets go of the GIL while it waits),
    so the two work at once. Only while nothing watches the connection's statements (execute
    wrappers, the query log): they would get neither a str nor each statement."""
    head = INSERT_HEAD.encode()
    in_flight = False
    with conn.wrap_database_errors:  # the driver's errors as django.db's, as a cursor raises them
        try:
            budget = max_statement_bytes(conn) - len(head)
            quoted = _quoted_rows(raw.literal, rows, batch_size)
            for chunk in sized_batches(quoted, batch_size, budget, len, where):
                if in_flight:
                    in_flight = False
                    raw.read_query_result()
                raw.send_query(head + b", ".join(chunk))
                in_flight = True
            if in_flight:
                in_flight = False
                raw.read_query_result()
        finally:
            if in_flight:  # interrupted while the server worked: read its answer, so the
                try:  # connection stays in step for the rollback that follows
                    raw.read_query_result()
                except Exception:
                    pass
