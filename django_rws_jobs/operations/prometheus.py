"""The Prometheus endpoint (``django_rws_jobs.urls`` serves it as ``metrics``): the queue's gauges
and the workers' counters, read in a fixed number of statements whatever the number of queues
(tests/test_metrics.py::test_the_endpoint_runs_the_same_statements_for_one_queue_or_twenty).

Counters are the pruned totals plus the kept minutes, read by one statement (a UNION), so a prune
between two reads cannot make one go down.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden

from ..conf import jobs_settings
from ..database import clock
from ..database.backends import backend_for
from ..database.connections import queue_alias
from ..models import Worker
from .metrics import ADDS, locked_due

#: Job states each queue's ``rws_queue_jobs`` gauge has (due: pending, or waiting for a slot of its
#: concurrency key, and due now: tests/test_metrics.py
#: test_a_waiting_job_whose_key_stays_full_is_due_in_the_gauges).
STATES = ("waiting", "pending", "due", "running", "failed", "cancelled", "blocked")
#: States of the ``rws_batches`` gauge.
BATCH_STATES = ("open", "sealed", "finished", "cancelled")
#: Counter name -> the rws_metrics column it sums.
COUNTERS = {
    "rws_jobs_done": ("done", "Jobs that succeeded"),
    "rws_job_attempts_failed": ("failed", "Failed attempts, retried or not"),
    "rws_jobs_dead": ("dead", "Jobs moved to the dead-letter list"),
    "rws_jobs_cancelled": ("cancelled", "Running jobs cancelled"),
    "rws_job_snoozes": ("snoozed", "Snoozes: attempts that ended in Snooze, not charged"),
    "rws_job_runs": ("runs", "Attempts whose run time is counted"),
    "rws_job_run_seconds": ("run_seconds", "Run time of those attempts, summed"),
    "rws_job_wait_seconds": ("wait_seconds", "Time from due to start of those attempts, summed"),
}
SUMS = ", ".join(f"SUM({c})" for c in ADDS)
COUNTERS_SQL = (
    f"SELECT queue, job_type, {', '.join(ADDS)} FROM rws_metric_totals UNION ALL "
    f"SELECT queue, job_type, {SUMS} FROM rws_metrics GROUP BY queue, job_type"
)


def allowed(request: HttpRequest) -> bool:
    """A staff user's session, or ``Authorization: Bearer <RWS_JOBS["METRICS_TOKEN"]>``, the
    scheme in any case and followed by one or more spaces, as RFC 7235 has it
    (tests/test_metrics.py::test_the_token_scheme_is_case_insensitive)."""
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and user.is_staff:
        return True
    token = jobs_settings.METRICS_TOKEN
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    credentials = credentials.lstrip(" ")
    if not token or scheme.lower() != "bearer" or not credentials:
        return False
    return hmac.compare_digest(credentials.encode(), str(token).encode())


def metrics_view(request: HttpRequest) -> HttpResponse:
    if not allowed(request):
        return HttpResponseForbidden(
            "rws metrics: a staff user's session or the METRICS_TOKEN bearer token\n"
        )
    try:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    except ImportError:
        raise ImproperlyConfigured(
            "django_rws_jobs' metrics need prometheus_client: pip install 'django-rws-jobs[prometheus]'"
        ) from None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(queue_alias()))
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


class QueueCollector:
    """prometheus_client's custom collector: one scrape, these statements."""

    def __init__(self, alias: str):
        self.alias = alias

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        now = int(clock.now(self.alias))
        jobs, due, paused, counters = read(self.alias, now)
        gauge = GaugeMetricFamily("rws_queue_jobs", "Jobs per queue and state", labels=["queue", "state"])
        age = GaugeMetricFamily(
            "rws_queue_oldest_due_age_seconds",
            "How long the oldest due job (pending or waiting for its concurrency key) waited",
            labels=["queue"],
        )
        queues = sorted({q for q, _ in jobs} | set(due) | set(paused))
        for queue in queues:
            for state in STATES:
                value = due.get(queue, (0, None))[0] if state == "due" else jobs.get((queue, state), 0)
                gauge.add_metric([queue, state], value)
            oldest = due.get(queue, (0, None))[1]
            age.add_metric([queue], max(now - oldest, 0) if oldest is not None else 0)
        yield gauge
        yield age
        pause = GaugeMetricFamily("rws_queue_paused", "1 while the queue is paused", labels=["queue"])
        for queue in queues:
            pause.add_metric([queue], 1 if paused.get(queue) else 0)
        yield pause
        locked = locked_due(self.alias, now)
        stuck = GaugeMetricFamily(
            "rws_queue_locked_due_jobs",
            "Pending jobs due for over a lease that a transaction keeps locked: every claim skips them",
            labels=["queue"],
        )
        for queue in sorted(set(queues) | set(locked)):
            stuck.add_metric([queue], locked.get(queue, 0))
        yield stuck
        yield from horizon_gauges(self.alias)
        live = [
            w
            for w in Worker.objects.using(self.alias).only("heartbeat_at", "heartbeat_interval", "claim_p99")
            if w.alive(now)
        ]
        yield GaugeMetricFamily(
            "rws_workers_alive", "Workers whose heartbeat is at most three intervals old", value=len(live)
        )
        claims = GaugeMetricFamily(
            "rws_worker_claim_p99_seconds",
            "The 99th percentile of a live worker's claims' durations between its last two heartbeats",
            labels=["worker"],
        )
        for w in sorted(live, key=lambda w: w.pk):
            if w.claim_p99 is not None:
                claims.add_metric([w.pk], w.claim_p99)
        yield claims
        states, oldest_open = read_batches(self.alias)
        batches = GaugeMetricFamily("rws_batches", "Batches per state (kept ones)", labels=["state"])
        for state in BATCH_STATES:
            batches.add_metric([state], states.get(state, 0))
        yield batches
        yield GaugeMetricFamily(
            "rws_batch_oldest_open_age_seconds",
            "How long the oldest batch still open (its with block not ended) has been open",
            value=max(now - oldest_open, 0) if oldest_open is not None else 0,
        )
        for name, (column, text) in COUNTERS.items():
            family = CounterMetricFamily(name, text, labels=["queue", "job_type"])
            i = ADDS.index(column)
            for (queue, job_type), values in sorted(counters.items()):
                family.add_metric([queue, job_type], values[i])
            yield family


def horizon_gauges(alias: str) -> Iterator[Any]:
    """What holds back the cleanup of the queue's table (BaseBackend.horizon): only the gauges
    the queue's database measures (tests/test_horizon.py)."""
    from prometheus_client.core import GaugeMetricFamily

    found = backend_for(connections[alias]).horizon()
    if found.snapshot_age is not None:
        yield GaugeMetricFamily(
            "rws_db_oldest_snapshot_age_seconds",
            "How long the oldest transaction that holds back the cleanup of the queue's rows has "
            "been open (0: none)",
            value=found.snapshot_age,
        )
        holder = GaugeMetricFamily(
            "rws_db_oldest_snapshot_holder",
            "The session holding that transaction; the value is when its last statement began (unix seconds)",
            labels=["pid", "user", "state"],
        )
        if found.holder is not None:
            h = found.holder
            holder.add_metric([str(h.pid), h.user, h.state], h.query_start or 0)
        yield holder
    if found.slots is not None:
        slots = GaugeMetricFamily(
            "rws_db_replication_slot_xmin_age",
            "Transactions since the xmin (or catalog_xmin) a replication slot holds back",
            labels=["slot", "xmin"],
        )
        for name, kind, age in found.slots:
            slots.add_metric([name, kind], age)
        yield slots
    if found.dead_rows is not None:
        yield GaugeMetricFamily(
            "rws_db_dead_rows",
            "Dead row versions of the queue's table not vacuumed yet",
            value=found.dead_rows,
        )
    if found.undo_history is not None:
        yield GaugeMetricFamily(
            "rws_db_undo_history_length",
            "InnoDB's history list length: undo logs not purged yet (every table's)",
            value=found.undo_history,
        )
    if found.wal_bytes is not None:
        yield GaugeMetricFamily(
            "rws_db_wal_bytes", "The size of the SQLite database's -wal file", value=found.wal_bytes
        )


def read_batches(alias: str) -> tuple[dict[str, int], int | None]:
    """state -> batches; when the oldest open batch was created. One statement."""
    with connections[alias].cursor() as c:
        c.execute(
            "SELECT state, COUNT(*), MIN(CASE WHEN state = 'open' THEN created_at END) FROM rws_batches "
            "GROUP BY state"
        )
        rows = c.fetchall()
    oldest = [r[2] for r in rows if r[2] is not None]
    return {state: n for state, n, _ in rows}, min(oldest) if oldest else None


def read(
    alias: str, now: int
) -> tuple[dict[Any, int], dict[str, Any], dict[str, bool], dict[Any, list[float]]]:
    """(queue, status) -> jobs; queue -> (due jobs, oldest due time); queue -> paused; (queue,
    job_type) -> counters (ADDS order). Four statements."""
    with connections[alias].cursor() as c:
        c.execute("SELECT queue, status, COUNT(*) FROM rws_jobs GROUP BY queue, status")
        jobs = {(q, s): n for q, s, n in c.fetchall()}
        c.execute(
            "SELECT queue, COUNT(*), MIN(next_run_at) FROM rws_jobs WHERE status IN ('pending', "
            "'waiting') AND next_run_at <= %s GROUP BY queue",
            [now],
        )
        due = {q: (n, oldest) for q, n, oldest in c.fetchall()}
        c.execute("SELECT name, paused FROM rws_queues")
        paused = {name: bool(p) for name, p in c.fetchall()}
        c.execute(COUNTERS_SQL)
        counters: dict[Any, list[float]] = {}
        for row in c.fetchall():
            mine = counters.setdefault((row[0], row[1]), [0] * len(ADDS))
            for i, value in enumerate(row[2:]):
                mine[i] += value or 0
    return jobs, due, paused, counters
