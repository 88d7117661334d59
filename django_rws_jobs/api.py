"""enqueue, jobs, failed_jobs, retry, delete and tick: the seed's methods, for Django."""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import math
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

from django.conf import settings
from django.db import IntegrityError, connections, transaction
from django.db.models import Case, Value, When
from django.utils import timezone

from . import ids
from .conf import jobs_settings
from .db import queue_alias
from .models import Job, Status
from .registry import registry

QUEUE_MAX = 64
UNIQUE_MAX = 191
ID_MAX = 64
INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

INSERT_HEAD = (
    "INSERT INTO rws_jobs (id, job_type, payload, status, attempts, max_retries, next_run_at, "
    "created_at, queue, priority, unique_key, unique_hash) VALUES "
)
INSERT_VALUES = "(%s, %s, %s, 'pending', 0, %s, %s, %s, %s, %s, %s, %s)"
INSERT_SQL = INSERT_HEAD + INSERT_VALUES
COPY_SQL = (
    "COPY rws_jobs (id, job_type, payload, max_retries, next_run_at, created_at, queue, priority, "
    "unique_key, unique_hash) FROM STDIN"
)


def _short(value: str, n: int = 40) -> str:
    return repr(value if len(value) <= n else value[:n] + "...")


def _text(name: str, value: Any, *, limit: int | None = None, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__} {value!r:.60}")
    if not empty and not value:
        raise ValueError(f"{name} must not be empty")
    if limit is not None and len(value) > limit:
        raise ValueError(f"{name} {_short(value)} is {len(value)} characters; the limit is {limit}")
    if "\x00" in value:
        raise ValueError(f"{name} {_short(value)} contains a NUL character, which PostgreSQL cannot store")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} {_short(value)} is not valid Unicode text: {exc.reason}") from None
    return value


def _int(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r:.60}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} {value} is out of range; it must be between {lo} and {hi}")
    return value


def _due_at(run_at: Any, run_in: Any, now: float) -> int:
    """Unix second at which the job becomes due, rounded up so it never runs early."""
    if run_at is not None and run_in is not None:
        raise ValueError("give run_at or run_in, not both")
    if run_at is not None:
        if not isinstance(run_at, dt.datetime):
            raise TypeError(f"run_at must be a datetime, got {type(run_at).__name__} {run_at!r:.60}")
        if timezone.is_naive(run_at):
            if settings.USE_TZ:
                raise ValueError(
                    f"run_at {run_at.isoformat()} is a naive datetime while USE_TZ is on; "
                    "pass an aware one (django.utils.timezone.now() + ...)"
                )
            run_at = timezone.make_aware(run_at, timezone.get_default_timezone())
        return max(math.ceil(run_at.timestamp()), 0)
    if run_in is not None:
        if isinstance(run_in, dt.timedelta):
            seconds = run_in.total_seconds()
        elif isinstance(run_in, (int, float)) and not isinstance(run_in, bool):
            seconds = float(run_in)
        else:
            raise TypeError(f"run_in must be a timedelta or seconds, got {type(run_in).__name__} {run_in!r:.60}")
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"run_in {run_in!r} must be a finite, non-negative delay")
        due = math.ceil(now + seconds)
        if due > INT64_MAX:
            raise ValueError(f"run_in {run_in!r} is too far ahead; the limit is {INT64_MAX - int(now)} seconds")
        return due
    return int(now)


def unique_hash(job_type: str, unique: str) -> str:
    return hashlib.sha256(f"{job_type}\x00{unique}".encode()).hexdigest()


def prepare(
    job_type: Any, payload: Any = "", *, queue: Any = None, priority: Any = None, run_at: Any = None,
    run_in: Any = None, unique: Any = None, max_retries: Any = None, now: float | None = None,
) -> list[Any]:
    """Validate one job's arguments and return its INSERT parameters (the id included)."""
    job_type = _text("job_type", job_type)
    payload = _text("payload", payload, empty=True)
    spec = registry.get(job_type)
    defaults = spec.options if spec is not None else {}
    queue = _text("queue name", defaults.get("queue", "default") if queue is None else queue, limit=QUEUE_MAX)
    priority = _int("priority", defaults.get("priority", 0) if priority is None else priority, INT64_MIN, INT64_MAX)
    if max_retries is None:
        max_retries = defaults.get("max_retries", jobs_settings.MAX_RETRIES)
    max_retries = _int("max_retries", max_retries, 0, INT32_MAX)
    if unique is not None:
        unique = _text("unique key", unique, limit=UNIQUE_MAX)
    now = time.time() if now is None else now
    due = _due_at(run_at, run_in, now)
    return [
        ids.new_id(), job_type, payload, max_retries, due, int(now), queue, priority, unique,
        unique_hash(job_type, unique) if unique is not None else None,
    ]


def enqueue(job_type: str, payload: str = "", *, queue: str | None = None, priority: int | None = None,
            run_at: dt.datetime | None = None, run_in: dt.timedelta | float | None = None,
            unique: str | None = None, max_retries: int | None = None, using: str | None = None) -> str:
    """Store a job and return its id; inside ``transaction.atomic()`` it commits with the caller.

    With ``unique=key``, while a job of this type and key is pending or running nothing is
    inserted and that job's id is returned (the database enforces it across processes).
    """
    params = prepare(job_type, payload, queue=queue, priority=priority, run_at=run_at, run_in=run_in,
                     unique=unique, max_retries=max_retries)
    alias = queue_alias(using)
    if params[-1] is None:
        _insert(connections[alias], params)
        job_id = params[0]
    else:
        job_id = _insert_unique(alias, params)
    _wake_local_workers(alias)
    return job_id


def _insert(conn: Any, params: list[Any]) -> None:
    """One job's INSERT, on the caller's connection and in its transaction (if any)."""
    cursor = _kept_cursor(conn)
    if cursor is None:
        with conn.cursor() as c:
            c.execute(INSERT_SQL, params)
    else:
        cursor.execute(INSERT_SQL, params)


def _kept_cursor(conn: Any) -> Any:
    """A cursor kept on ``conn`` for enqueue's INSERT, made as ``conn.cursor()`` makes one.

    ``cursor()`` builds a new driver cursor and Django's wrapper around it every time: with
    psycopg 3 that was a third of enqueue's CPU time in the client (measured). The kept one is
    Django's own wrapper, so ``execute_wrapper`` and error translation still apply; while Django
    logs queries (DEBUG, ``assertNumQueries``) each enqueue takes a new cursor, which logs. It is
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


def _wake_local_workers(alias: str) -> None:
    from . import wakeup

    if wakeup.listeners:  # a worker runs in this process: wake it when the job commits
        transaction.on_commit(wakeup.notify, using=alias)


def enqueue_many(jobs: Iterable[Any], *, using: str | None = None, batch_size: int = 1000) -> list[str]:
    """Store many jobs at once and return their ids, in order.

    Each item is a job_type string, a ``(job_type, payload)`` pair, or a dict of ``enqueue``'s
    arguments (``job_type``, ``payload``, ``queue``, ...). The rows go in with multi-row inserts
    (COPY on PostgreSQL), in the caller's transaction, while later items are still being
    validated: an invalid item raises and rolls back everything of the call, so that nothing of it
    is stored. Unique items keep ``enqueue``'s semantics (the id of the live job holding the key is
    returned).
    """
    _int("batch_size", batch_size, 1, 10_000)
    alias = queue_alias(using)
    conn = connections[alias]
    rows: list[list[Any]] = []

    def plain() -> Iterator[list[Any]]:
        """Validate the items one by one; yield the rows without a unique key."""
        for index, item in enumerate(jobs):
            try:
                if isinstance(item, str):
                    row = prepare(item)
                elif isinstance(item, dict):
                    row = prepare(**item)
                elif isinstance(item, (tuple, list)):
                    row = prepare(*item)
                else:
                    raise TypeError(
                        f"a job must be a job_type, a (job_type, payload) pair or a dict, got {item!r:.60}")
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"job #{index}: {exc}") from None
            rows.append(row)
            if row[-1] is None:
                yield row

    with transaction.atomic(using=alias):
        with conn.cursor() as c:
            if conn.vendor == "postgresql" and hasattr(c.cursor, "copy"):  # psycopg 3
                # COPY streams the rows: several times faster than multi-row INSERTs here.
                with conn.wrap_database_errors, c.cursor.copy(COPY_SQL) as copy:
                    for row in plain():
                        copy.write_row(row)
            elif conn.vendor == "mysql" and hasattr(c.cursor.connection, "literal"):  # mysqlclient
                _insert_quoted(conn, c, plain(), batch_size)
            else:
                if conn.vendor == "sqlite":  # at most SQLite's limit on a statement's parameters
                    batch_size = min(batch_size, _sqlite_rows_per_statement(c.cursor.connection))
                for chunk in _batches(plain(), batch_size):
                    values = ", ".join([INSERT_VALUES] * len(chunk))
                    c.execute(INSERT_HEAD + values, [v for row in chunk for v in row])
        ids = [r[0] if r[-1] is None else _insert_unique(alias, r) for r in rows]
        _wake_local_workers(alias)
    return ids


def _batches(rows: Iterator[list[Any]], size: int) -> Iterator[list[list[Any]]]:
    while chunk := list(itertools.islice(rows, size)):
        yield chunk


def _sqlite_rows_per_statement(raw: Any) -> int:
    """Rows (10 parameters each) that fit SQLite's limit on a statement's parameters: 32,766 in
    SQLite's default build since 3.32, 999 before; builds differ (Debian's: 250,000)."""
    try:
        import sqlite3

        limit = raw.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)  # Python 3.11+
    except AttributeError:
        limit = 999
    return max(limit // 10, 1)


def _insert_quoted(conn: Any, c: Any, rows: Iterator[list[Any]], batch_size: int) -> None:
    """MySQL: multi-row INSERTs whose values are quoted here by the driver's own quoting, each
    distinct value once a batch. mysqlclient quotes every parameter of every row, which was most
    of a bulk enqueue's time in the client (10 values a row), while the rows of one call mostly
    repeat the same job type, payload, queue, due time and limits. The ids are our own UUIDs
    (hex digits and dashes), which need no escaping.

    The statements are pipelined: each is sent, and the next batch is validated and built while
    the server inserts the rows of the one before (the driver lets go of the GIL while it waits),
    so the two cores work at once. While the connection's statements are watched (execute
    wrappers, the query log) they go through the cursor one by one instead, so that the watchers
    see each of them."""
    raw = c.cursor.connection  # MySQLdb's connection
    literal = raw.literal
    head = INSERT_HEAD.encode()
    tail_format = INSERT_VALUES.encode().replace(b"(%s, ", b"', ", 1)  # the row after its id
    pipelined = (hasattr(raw, "send_query") and hasattr(raw, "read_query_result")
                 and not conn.execute_wrappers and not conn.queries_logged)
    in_flight = False
    with conn.wrap_database_errors:  # the driver's errors as django.db's, as a cursor raises them
        try:
            for chunk in _batches(rows, batch_size):
                quoted: dict[tuple[type, Any], bytes] = {}
                tails: dict[tuple[Any, ...], bytes] = {}
                values = []
                for job_id, *rest in chunk:
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
                    values.append(b"('" + job_id.encode() + tail)
                sql = head + b", ".join(values)
                if not pipelined:
                    c.execute(sql)
                    continue
                if in_flight:
                    in_flight = False
                    raw.read_query_result()
                raw.send_query(sql)
                in_flight = True
            if in_flight:
                in_flight = False
                raw.read_query_result()
        finally:
            if in_flight:  # interrupted while the server worked: read its answer, so the
                try:       # connection stays in step for the rollback that follows
                    raw.read_query_result()
                except Exception:
                    pass


def _insert_unique(alias: str, params: list[Any]) -> str:
    conn = connections[alias]
    digest = params[-1]
    # A shared-lock read sees the latest commit even where a plain read sees an older snapshot
    # (MySQL's REPEATABLE READ); it is only the fallback, because it holds the holder's row until
    # the caller commits.
    share = {"postgresql": " FOR SHARE", "mysql": " LOCK IN SHARE MODE"}.get(conn.vendor, "")
    lookup = "SELECT id, status FROM rws_jobs WHERE unique_hash = %s"
    for _ in range(10):
        try:
            with transaction.atomic(using=alias), conn.cursor() as c:
                c.execute(INSERT_SQL, params)
            return params[0]
        except IntegrityError:
            pass
        with transaction.atomic(using=alias), conn.cursor() as c:
            c.execute(lookup, [digest])
            row = c.fetchone()
            if row is None and share:
                c.execute(lookup + share, [digest])
                row = c.fetchone()
            if row is not None and row[1] in (Status.PENDING, Status.RUNNING):
                return row[0]
            if row is not None:
                # A failed row still holding the key (a seed writer does not clear it): free it.
                c.execute("UPDATE rws_jobs SET unique_hash = NULL WHERE id = %s AND status = 'failed'", [row[0]])
        # Otherwise the holder finished between the two statements: insert again.
    raise RuntimeError(f"could not enqueue unique job {params[1]!r} key {params[8]!r}: kept conflicting")


def jobs(status: str | None = None, limit: int = 100, *, using: str | None = None) -> list[Job]:
    """Jobs with ``status`` (all when None), highest priority and earliest due first."""
    if status is not None and status not in Status.values:
        raise ValueError(f"status {status!r} is not one of {', '.join(Status.values)}")
    _int("limit", limit, 0, INT64_MAX)
    qs = Job.objects.using(queue_alias(using)).in_queue_order()
    if status is not None:
        qs = qs.filter(status=status)
    return list(qs[:limit])


def failed_jobs(limit: int = 100, *, using: str | None = None) -> list[Job]:
    """The dead-letter list."""
    return jobs(Status.FAILED, limit, using=using)


def retry(job_id: str, *, using: str | None = None, now: int | None = None) -> bool:
    """Put a failed job back, due now with attempts reset. False if there is no failed job
    ``job_id``, or if a pending or running job already holds its unique key."""
    alias = queue_alias(using)
    now = int(time.time()) if now is None else now
    with transaction.atomic(using=alias):
        job = Job.objects.using(alias).select_for_update().filter(id=job_id, status=Status.FAILED).first()
        if job is None:
            return False
        digest = unique_hash(job.job_type, job.unique_key) if job.unique_key is not None else None
        try:
            with transaction.atomic(using=alias):
                changed = Job.objects.using(alias).filter(id=job_id, status=Status.FAILED).update(
                    status=Status.PENDING, attempts=0, next_run_at=now, unique_hash=digest,
                    locked_by=None, locked_until=None, failed_at=None,
                )
        except IntegrityError:
            return False
    return changed == 1


#: Rows per retry_many statement at most: an id in the IN list and up to two CASE parameters
#: each, fewer where a SQLite build allows fewer parameters (_retry_batch_size).
RETRY_BATCH = 1000


def retry_many(job_ids: Iterable[str], *, using: str | None = None,
               now: int | None = None) -> tuple[list[str], list[str]]:
    """``retry`` for many jobs, a few statements per batch of ids instead of several per job.

    Returns (retried, blocked): the failed jobs put back, due now with attempts reset, and the
    failed jobs left alone because another job holds their unique key (as ``retry`` leaves them).
    Ids of no failed job are in neither. Each batch commits on its own.
    """
    if isinstance(job_ids, str):
        raise TypeError(f"job_ids must be an iterable of ids, not the str {_short(job_ids)}")
    ids = [_text("job id", i, empty=True) for i in dict.fromkeys(job_ids)]
    alias = queue_alias(using)
    now = int(time.time()) if now is None else now
    retried: list[str] = []
    blocked: list[str] = []
    size = _retry_batch_size(connections[alias])
    for start in range(0, len(ids), size):
        done, held = _retry_batch(alias, ids[start:start + size], now)
        retried += done
        blocked += held
    return retried, blocked


def _retry_batch_size(conn: Any) -> int:
    if conn.vendor != "sqlite":
        return RETRY_BATCH
    conn.ensure_connection()
    return max(min(RETRY_BATCH, _sqlite_rows_per_statement(conn.connection) * 10 // 3), 1)


def _retry_batch(alias: str, ids: list[str], now: int) -> tuple[list[str], list[str]]:
    """One batch of retry_many, in one transaction: lock the failed rows, leave out those whose
    unique key another row holds, put the rest back in one UPDATE. Pinned by
    tests/test_admin_input.py::test_retry_all_takes_a_bounded_number_of_queries."""
    jobs = Job.objects.using(alias)
    with transaction.atomic(using=alias):
        rows = list(jobs.select_for_update().filter(id__in=ids, status=Status.FAILED)
                    .values_list("id", "job_type", "unique_key"))
        digests = {job_id: unique_hash(t, k) for job_id, t, k in rows if k is not None}
        holders = dict(jobs.filter(unique_hash__in=set(digests.values())).values_list("unique_hash", "id"))
        blocked, taken = [], set()
        for job_id, digest in digests.items():
            if holders.get(digest, job_id) != job_id or digest in taken:
                blocked.append(job_id)  # held by another row, or by a row retried just before
            else:
                taken.add(digest)
        left_out = set(blocked)
        retried = [row[0] for row in rows if row[0] not in left_out]
        if not retried:
            return [], blocked
        keyed = [When(id=i, then=Value(digests[i])) for i in retried if i in digests]
        try:
            with transaction.atomic(using=alias):
                jobs.filter(id__in=retried).update(
                    status=Status.PENDING, attempts=0, next_run_at=now,
                    unique_hash=Case(*keyed, default=None) if keyed else None,
                    locked_by=None, locked_until=None, failed_at=None)
        except IntegrityError:
            # A key was taken since the look above (an enqueue that committed meanwhile): one by
            # one, as retry() does, which tells which.
            return _retry_each(alias, retried, blocked, now)
    return retried, blocked


def _retry_each(alias: str, ids: list[str], blocked: list[str], now: int) -> tuple[list[str], list[str]]:
    retried = []
    for job_id in ids:
        (retried if retry(job_id, using=alias, now=now) else blocked).append(job_id)
    return retried, blocked


def delete(job_id: str, *, using: str | None = None) -> bool:
    """Delete a job that is not running. False when there is no such job."""
    alias = queue_alias(using)
    return Job.objects.using(alias).filter(id=job_id).exclude(status=Status.RUNNING).delete()[0] > 0


def tick(*, queues: list[str] | None = None, using: str | None = None) -> bool:
    """Claim one due job and run it in the calling thread. False when none is due."""
    from .runner import run_claimed
    from .store import Store
    from .worker import claim_token

    alias = queue_alias(using)
    store = Store(connections[alias])
    lease = int(jobs_settings.LEASE_SECONDS)
    now = int(time.time())
    claimed = store.claim(claim_token(), now, now + lease, queues, 1)
    if not claimed:
        return False
    with _renewing(alias, claimed[0].token, lease):
        run_claimed(store, claimed[0])
    return True


@contextmanager
def _renewing(alias: str, token: str, lease: int) -> Iterator[None]:
    """Renew a claim's lease from a side thread while the calling thread runs the job."""
    from .db import private_connection
    from .store import Store

    done = threading.Event()

    def renew() -> None:
        conn = None
        try:
            while not done.wait(max(lease / 3, 0.2)):
                try:
                    conn = conn or private_connection(alias)
                    Store(conn).renew([token], int(time.time()) + lease)
                except Exception:  # a failed renewal is retried next round; the lease is long
                    if conn is not None:
                        conn.close()
                    conn = None
        finally:
            if conn is not None:
                conn.close()

    thread = threading.Thread(target=renew, name="rws-tick-lease", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
