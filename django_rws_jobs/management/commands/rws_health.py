"""python manage.py rws_health: exit 0 when the queue is healthy, 1 when not, with one line why.

For orchestrators' probes and alerting. ``--heartbeat-file PATH`` alone never opens a database
connection: a liveness probe that restarted every worker during a database blip would make the
blip an outage. Every other check reads indexes only (tests/test_health.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_rws_jobs.database import clock
from django_rws_jobs.database.backends import backend_for
from django_rws_jobs.database.connections import queue_alias
from django_rws_jobs.flow.pauses import paused_queues
from django_rws_jobs.management import setting_default
from django_rws_jobs.models import BatchRecord, Job, Status, Worker
from django_rws_jobs.operations.metrics import locked_due
from django_rws_jobs.operations.worker_rows import DEAD_AFTER, heartbeat_interval, this_host

#: What a check found: (healthy, what it says).
Finding = tuple[bool, str]


def _non_negative(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a whole number") from None
    if n < 0:
        raise ValueError(f"{n} is below 0")
    return n


class Command(BaseCommand):
    help = (
        "Exit 0 when the queue is healthy and 1 when it is not, with one line saying why: the "
        "database answers and the migrations are applied, and each threshold given holds."
    )
    requires_system_checks: list[str] = []  # a probe: fast, and no connection it was not asked for
    requires_migrations_checks = False

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database", default=None, help=f"database alias (default: {setting_default('DATABASE')})"
        )
        parser.add_argument("--worker", action="store_true", help="a live worker of this host is registered")
        parser.add_argument(
            "--heartbeat-file",
            metavar="PATH",
            help="the file `rws_worker --heartbeat-file PATH` keeps fresh was touched within three "
            "heartbeat intervals; alone, no database connection is opened",
        )
        parser.add_argument(
            "--max-due-age", type=float, metavar="SECONDS", help="the oldest due job waited at most this long"
        )
        parser.add_argument("--max-due", type=_non_negative, metavar="N", help="at most N jobs are due")
        parser.add_argument(
            "--include-paused",
            action="store_true",
            help="--max-due and --max-due-age count the jobs of paused queues too",
        )
        parser.add_argument("--max-failed", type=_non_negative, metavar="N", help="at most N jobs are dead")
        parser.add_argument(
            "--max-blocked",
            type=_non_negative,
            metavar="N",
            help="at most N jobs are blocked (enqueued with after=)",
        )
        parser.add_argument(
            "--max-locked-due",
            type=_non_negative,
            metavar="N",
            help="at most N pending jobs due for over a lease are kept locked by a transaction "
            "(every claim skips them)",
        )
        parser.add_argument(
            "--max-snapshot-age",
            type=float,
            metavar="SECONDS",
            help="no transaction has held back the cleanup of the queue's rows longer than this "
            "(PostgreSQL, MariaDB)",
        )
        parser.add_argument(
            "--max-dead-rows",
            type=_non_negative,
            metavar="N",
            help="at most N dead row versions of the queue's table wait for VACUUM (PostgreSQL), "
            "at most N undo logs wait for purge (MariaDB's history list length)",
        )
        parser.add_argument(
            "--max-wal-bytes",
            type=_non_negative,
            metavar="N",
            help="the SQLite database's -wal file is at most N bytes",
        )
        parser.add_argument(
            "--max-claim-p99",
            type=float,
            metavar="SECONDS",
            help="no live worker's claims took longer than this at their 99th percentile, between "
            "its last two heartbeats (a long transaction, a missing vacuum: docs/howto/databases.md)",
        )
        parser.add_argument(
            "--max-open-batch-age",
            type=float,
            metavar="SECONDS",
            help="no batch has been open (its with block not ended) longer than this",
        )
        parser.add_argument("--json", action="store_true", help="print a JSON object instead of a line")

    def handle(self, *args: Any, **options: Any) -> None:
        for flag in ("max_due_age", "max_open_batch_age", "max_snapshot_age", "max_claim_p99"):
            if options[flag] is not None and not options[flag] >= 0:
                name = "--" + flag.replace("_", "-")
                raise CommandError(f"{name} {options[flag]!r} must be a number of seconds >= 0")
        findings: dict[str, Finding] = {}
        if options["heartbeat_file"] is not None:
            findings["heartbeat_file"] = heartbeat_file(options["heartbeat_file"])
        database_checks = (
            options["worker"],
            options["max_due_age"] is not None,
            options["max_due"] is not None,
            options["max_failed"] is not None,
            options["max_blocked"] is not None,
            options["max_open_batch_age"] is not None,
            options["max_locked_due"] is not None,
            *(options[flag] is not None for flag in HORIZON_FLAGS),
        )
        if options["heartbeat_file"] is None or any(database_checks):
            findings.update(database(options))
        healthy = all(ok for ok, _ in findings.values())
        bad = [text for ok, text in findings.values() if not ok]
        line = ("healthy: " if healthy else "unhealthy: ") + "; ".join(
            bad or [t for _, t in findings.values()]
        )
        if options["json"]:
            out = {
                "healthy": healthy,
                "reason": line,
                "checks": {k: {"ok": ok, "says": t} for k, (ok, t) in findings.items()},
            }
            self.stdout.write(json.dumps(out))
        else:
            self.stdout.write(line)
        if not healthy:
            sys.exit(1)


def heartbeat_file(path: str) -> Finding:
    """Touched within three heartbeat intervals (LEASE_SECONDS / 3 each)?"""

    limit = DEAD_AFTER * heartbeat_interval()
    try:
        age = time.time() - os.stat(path).st_mtime
    except OSError as exc:
        return False, f"heartbeat file {path}: {exc.strerror or exc}"
    if age > limit:
        return (
            False,
            f"heartbeat file {path} is {age:.0f}s old, over {limit:g}s (three heartbeats): "
            "the worker is gone or stuck",
        )
    return True, f"heartbeat file {age:.1f}s old"


def database(options: dict[str, Any]) -> dict[str, Finding]:
    """The database answers and the queue's migrations are applied; then the thresholds."""
    from django.db import DatabaseError, connections

    try:
        alias = queue_alias(options["database"])
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    findings: dict[str, Finding] = {}
    try:
        conn = connections[alias]
        with conn.cursor() as c:
            c.execute("SELECT 1")
        findings["database"] = (True, f"database {alias!r} answers")
        missing = unapplied(conn)
        if missing:
            findings["migrations"] = (
                False,
                f"migrations not applied: {', '.join(missing)} (manage.py migrate)",
            )
            return findings
        findings["migrations"] = (True, "migrations applied")
        findings.update(thresholds(alias, options))
    except DatabaseError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        findings["database"] = (False, f"database {alias!r} does not answer: {first}")
    return findings


def unapplied(conn: Any) -> list[str]:
    """The queue app's migrations that the database has not applied."""
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(conn, ignore_no_migrations=True)
    app = "django_rws_jobs"
    ours = [key for key in loader.graph.leaf_nodes(app)]
    plan = loader.graph.forwards_plan(ours[0]) if ours else []
    return [name for label, name in plan if label == app and (label, name) not in loader.applied_migrations]


def thresholds(alias: str, options: dict[str, Any]) -> dict[str, Finding]:
    from django.db import connections

    now = int(clock.now(alias))
    found: dict[str, Finding] = {}
    if options["worker"]:
        host = this_host()
        live = [w for w in Worker.objects.using(alias).filter(host=host) if w.alive(now)]
        found["worker"] = (
            (True, f"{len(live)} live worker(s) on {host}")
            if live
            else (False, f"no live worker registered on {host}")
        )
    age_limit, due_limit = options["max_due_age"], options["max_due"]
    if age_limit is not None or due_limit is not None:
        paused = [] if options["include_paused"] else paused_queues(using=alias)
        with connections[alias].cursor() as c:
            due = Due(c, now, due_limit, want_oldest=age_limit is not None, paused=paused)
        left_out = f" (paused queues left out: {', '.join(paused)})" if paused else ""
        if age_limit is not None:
            age = max(now - due.oldest[0], 0) if due.oldest is not None else 0
            ok = age <= age_limit
            found["due_age"] = (
                ok,
                f"the oldest due job waited {age}s{describe(due.oldest)}"
                + ("" if ok else f", over --max-due-age {age_limit:g}")
                + left_out,
            )
        if due_limit is not None:
            found["max_due"] = counted(due.count, due_limit, "due", "max-due", left_out)
    if options["max_failed"] is not None:
        limit = options["max_failed"]
        rows = Job.objects.using(alias).filter(status=Status.FAILED).order_by()
        n = rows[: limit + 1].count()  # an index range that LIMIT stops
        found["max_failed"] = counted(n, limit, "dead", "max-failed", "")
    if options["max_blocked"] is not None:
        limit = options["max_blocked"]
        n = Job.objects.using(alias).filter(status=Status.BLOCKED).order_by()[: limit + 1].count()
        found["max_blocked"] = counted(n, limit, "blocked", "max-blocked", "")
    if options["max_locked_due"] is not None:
        found["max_locked_due"] = locked(alias, now, options["max_locked_due"])
    if any(options[flag] is not None for flag in HORIZON_FLAGS):
        found.update(horizon(alias, options))
    if options["max_open_batch_age"] is not None:
        found["open_batch_age"] = open_batch_age(alias, now, options["max_open_batch_age"])
    if options["max_claim_p99"] is not None:
        found["claim_p99"] = claim_p99(alias, now, options["max_claim_p99"])
    return found


def claim_p99(alias: str, now: int, limit: float) -> Finding:
    """The slowest live worker's claims, at their 99th percentile between its last two
    heartbeats (rws_workers.claim_p99)."""

    live = [
        w
        for w in Worker.objects.using(alias).only("heartbeat_at", "heartbeat_interval", "claim_p99")
        if w.alive(now) and w.claim_p99 is not None
    ]
    if not live:
        return True, "no live worker has reported its claims' durations yet"
    slowest = max(live, key=lambda w: w.claim_p99)
    ok = slowest.claim_p99 <= limit
    return ok, (
        f"the slowest claims, worker {slowest.pk}'s: {1000 * slowest.claim_p99:.1f} ms at the 99th percentile"
        + ("" if ok else f", over --max-claim-p99 {limit:g}: see docs/howto/databases.md")
    )


def locked(alias: str, now: int, limit: int) -> Finding:
    """Pending jobs due for over a lease that a transaction keeps locked (metrics.locked_due):
    claims skip them, so nothing runs them until that transaction ends."""

    by_queue = locked_due(alias, now)
    n = sum(by_queue.values())
    queues = ", ".join(f"{q!r}: {k}" for q, k in sorted(by_queue.items()))
    note = f" (queues {queues}; a transaction holds them: see docs/howto/databases.md)" if n else ""
    ok = n <= limit
    return ok, (
        f"{n} due job(s) locked by a transaction for over a lease"
        + ("" if ok else f", over --max-locked-due {limit}")
        + note
    )


HORIZON_FLAGS = ("max_snapshot_age", "max_dead_rows", "max_wal_bytes")


def horizon(alias: str, options: dict[str, Any]) -> dict[str, Finding]:
    """What holds back the cleanup of the queue's table (BaseBackend.horizon); a limit the
    database has no measure for is said so, and healthy."""
    from django.db import connections

    conn = connections[alias]
    h = backend_for(conn).horizon()
    found: dict[str, Finding] = {}
    see = "see docs/howto/databases.md"
    limit = options["max_snapshot_age"]
    if limit is not None:
        if h.snapshot_age is None:
            found["snapshot_age"] = (True, f"the oldest snapshot's age is not measured on {conn.vendor}")
        else:
            who = f" (held by {h.holder.describe()})" if h.holder is not None else ""
            ok = h.snapshot_age <= limit
            found["snapshot_age"] = (
                ok,
                f"the oldest transaction holding back the queue's cleanup has been open "
                f"{h.snapshot_age:.0f}s{who}" + ("" if ok else f", over --max-snapshot-age {limit:g}: {see}"),
            )
    limit = options["max_dead_rows"]
    if limit is not None:
        if h.dead_rows is not None:
            n, what = h.dead_rows, "dead row version(s) of rws_jobs not vacuumed"
        elif h.undo_history is not None:
            n, what = h.undo_history, "undo log(s) not purged (history list length)"
        else:
            n, what = None, ""
        if n is None:
            found["dead_rows"] = (True, f"dead rows are not measured on {conn.vendor}")
        else:
            ok = n <= limit
            found["dead_rows"] = (
                ok,
                f"{n} {what}" + ("" if ok else f", over --max-dead-rows {limit}: {see}"),
            )
    limit = options["max_wal_bytes"]
    if limit is not None:
        if h.wal_bytes is None:
            found["wal_bytes"] = (True, f"the WAL file's size is not measured on {conn.vendor}")
        else:
            ok = h.wal_bytes <= limit
            found["wal_bytes"] = (
                ok,
                f"the -wal file is {h.wal_bytes} bytes"
                + ("" if ok else f", over --max-wal-bytes {limit}: {see}"),
            )
    return found


def open_batch_age(alias: str, now: int, limit: float) -> Finding:
    """The oldest open batch: one whose with block never ended (its process died in it) stays
    open for ever and never finishes."""

    oldest = (
        BatchRecord.objects.using(alias)
        .filter(state="open")
        .order_by("created_at")
        .values_list("id", "created_at")
        .first()
    )
    if oldest is None:
        return True, "no batch is open"
    age = max(now - oldest[1], 0)
    if age > limit:
        return False, f"batch {oldest[0]} has been open {age}s, over --max-open-batch-age {limit:g}"
    return True, f"the oldest open batch has been open {age}s"


def counted(n: int, limit: int, label: str, flag: str, note: str) -> Finding:
    """A count that stopped past ``limit`` (n = limit + 1 says more than limit)."""
    shown = f"more than {limit}" if n > limit else str(n)
    return n <= limit, f"{shown} {label} job(s)" + (f", over --{flag} {limit}" if n > limit else "") + note


def describe(oldest: tuple[int, str, str | None] | None) -> str:
    if oldest is None:
        return ""
    _, queue, key = oldest
    waits = "" if key is None else f", waiting for a slot of concurrency key {key!r}"
    return f" (queue {queue!r}{waits})"


#: The states of a due job: pending, or waiting for a slot of its concurrency key (a key whose
#: slots stay taken, by long jobs or by a job a rust-web-server worker failed, which keeps its
#: slot, makes its waiting jobs' wait grow: tests/test_health.py
#: test_a_waiting_job_whose_key_stays_full_is_due).
DUE_STATES = ("pending", "waiting")


class Due:
    """The due jobs (pending or waiting, due now) outside ``paused``: ``count``, counted up to
    ``limit + 1`` (None: not counted), and ``oldest``, the (due time, queue, concurrency key) of
    the one due longest (None when none is, or not asked).

    Every statement reads an index range that its LIMIT stops, or one index probe, so the answer
    costs the same with a million rows (tests/test_explain.py
    test_rws_health_reads_index_ranges_with_a_million_rows). With no queue to leave out, the
    ranges are the due index's, one per state. With queues to leave out, whose backlog may be
    any size, the due index (which has no queue) would read their rows: the ranges are then the
    queue index's, one per state, other queue and priority, each queue and priority found by one
    probe, so the left-out queues' rows are never read.
    """

    def __init__(self, c: Any, now: int, limit: int | None, *, want_oldest: bool, paused: list[str]):

        self.c, self.now = c, now
        # Each range's index is named where the database takes hints (PostgreSQL takes none and
        # picks it by its statistics): MariaDB read one queue's band from the claim index,
        # filtering out the paused queues' rows (tests/test_explain.py, as above).
        backend = backend_for(c.db)
        self.due_hint = backend.due_index_hint()
        self.queue_hint = backend.queue_index_hint()
        self.left = None if limit is None else limit + 1  # rows still to count
        self.count = 0
        self.oldest: tuple[int, str, str | None] | None = None
        self.want_oldest = want_oldest
        for status in DUE_STATES:
            if paused:
                self._walk(status, set(paused))
            else:
                self._range(status, self.due_hint, "", [])

    def _range(self, status: str, hint: str, where: str, params: list[Any]) -> None:
        """Count and find the oldest in one range: ``status``, ``where``, due now."""
        c = self.c
        rows = f"rws_jobs{hint} WHERE status = %s{where} AND next_run_at <= %s"
        args = [status, *params, self.now]
        if self.left:
            c.execute(f"SELECT COUNT(*) FROM (SELECT 1 FROM {rows} LIMIT {self.left}) AS due", args)
            n = c.fetchone()[0]
            self.count += n
            self.left -= n
        if self.want_oldest:
            c.execute(
                f"SELECT next_run_at, queue, concurrency_key FROM {rows} ORDER BY next_run_at LIMIT 1", args
            )
            row = c.fetchone()
            if row is not None and (self.oldest is None or row[0] < self.oldest[0]):
                self.oldest = (row[0], row[1], row[2])

    def _walk(self, status: str, paused: set[str]) -> None:
        """_range over each queue not in ``paused`` and each of its priorities: a loose index
        scan of the queue index, one probe per queue and per priority."""
        queue = self._probe("SELECT MIN(queue) FROM rws_jobs WHERE status = %s", [status])
        while queue is not None and (self.left or self.want_oldest):
            if queue not in paused:
                band = "SELECT MAX(priority) FROM rws_jobs WHERE status = %s AND queue = %s"
                priority = self._probe(band, [status, queue])
                while priority is not None and (self.left or self.want_oldest):
                    where = " AND queue = %s AND priority = %s"
                    self._range(status, self.queue_hint, where, [queue, priority])
                    priority = self._probe(band + " AND priority < %s", [status, queue, priority])
            queue = self._probe(
                "SELECT MIN(queue) FROM rws_jobs WHERE status = %s AND queue > %s", [status, queue]
            )

    def _probe(self, sql: str, params: list[Any]) -> Any:
        self.c.execute(sql, params)
        return self.c.fetchone()[0]
