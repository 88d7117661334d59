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
        parser.add_argument("--database", default=None, help="database alias (default: RWS_JOBS['DATABASE'])")
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
        parser.add_argument("--max-failed", type=_non_negative, metavar="N", help="at most N jobs are dead")
        parser.add_argument("--json", action="store_true", help="print a JSON object instead of a line")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["max_due_age"] is not None and not options["max_due_age"] >= 0:
            raise CommandError(f"--max-due-age {options['max_due_age']!r} must be a number of seconds >= 0")
        findings: dict[str, Finding] = {}
        if options["heartbeat_file"] is not None:
            findings["heartbeat_file"] = heartbeat_file(options["heartbeat_file"])
        database_checks = (
            options["worker"],
            options["max_due_age"] is not None,
            options["max_due"] is not None,
            options["max_failed"] is not None,
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
    from django_rws_jobs.worker_rows import DEAD_AFTER, heartbeat_interval

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

    from django_rws_jobs.db import queue_alias

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
    from django_rws_jobs import clock
    from django_rws_jobs.models import Job, Status, Worker
    from django_rws_jobs.worker_rows import this_host

    now = int(clock.now(alias))
    jobs = Job.objects.using(alias)
    found: dict[str, Finding] = {}
    if options["worker"]:
        host = this_host()
        live = [w for w in Worker.objects.using(alias).filter(host=host) if w.alive(now)]
        found["worker"] = (
            (True, f"{len(live)} live worker(s) on {host}")
            if live
            else (False, f"no live worker registered on {host}")
        )
    if options["max_due_age"] is not None:
        oldest = (
            jobs.filter(status=Status.PENDING)
            .order_by("next_run_at")
            .values_list("next_run_at", flat=True)
            .first()
        )
        age = max(now - oldest, 0) if oldest is not None and oldest <= now else 0
        limit = options["max_due_age"]
        found["due_age"] = (
            age <= limit,
            f"the oldest due job waited {age}s" + ("" if age <= limit else f", over --max-due-age {limit:g}"),
        )
    for key, status, label, due in (
        ("max_due", Status.PENDING, "due", True),
        ("max_failed", Status.FAILED, "dead", False),
    ):
        if options[key] is None:
            continue
        limit = options[key]
        rows = jobs.filter(status=status, **({"next_run_at__lte": now} if due else {})).order_by()
        n = rows[: limit + 1].count()  # an index range that LIMIT stops
        shown = f"more than {limit}" if n > limit else str(n)
        found[key] = (
            n <= limit,
            f"{shown} {label} job(s)" + (f", over --{key.replace('_', '-')} {limit}" if n > limit else ""),
        )
    return found
