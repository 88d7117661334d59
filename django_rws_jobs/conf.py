"""The ``RWS_JOBS`` settings, read on every access so ``override_settings`` works."""

from __future__ import annotations

from typing import Any

from django.conf import settings

# Each key's comment is its description in the settings reference (docs/_ext/rws_reference.py).
DEFAULTS: dict[str, Any] = {
    # The alias of DATABASES that holds the queue's tables.
    "DATABASE": "default",
    # Retries after the first attempt, unless @job(max_retries=) or enqueue(max_retries=) say.
    "MAX_RETRIES": 3,
    # Seconds before the first retry.
    "BACKOFF_INITIAL": 0.5,
    # Each further retry waits this many times longer than the one before.
    "BACKOFF_MULTIPLIER": 2.0,
    # Seconds: the longest wait before a retry.
    "BACKOFF_MAX": 3600,
    # Each computed wait before a retry (not Retry(delay=)) is spread by up to this share of it
    # either way, so that jobs failing together do not retry together: a number in [0, 1).
    "BACKOFF_JITTER": 0.1,
    # Seconds an idle worker waits before it looks for due jobs again (a wake-up ends it sooner).
    "POLL_INTERVAL": 0.5,
    # Seconds a claim holds a job; renewed every third of it while the job runs. A dead worker's
    # jobs run again once their leases expire.
    "LEASE_SECONDS": 60,
    # Seconds a stopping worker lets running jobs finish before it hands the rest back.
    "SHUTDOWN_TIMEOUT": 30,
    # Seconds a job may run before it fails with JobTimeout; None: no limit. @job(timeout=) and
    # enqueue(timeout=) override it.
    "TIMEOUT": None,
    # Seconds a timed-out handler gets to stop before its thread is abandoned (thread pool) or
    # its child process is killed with SIGKILL (process pool).
    "TIMEOUT_GRACE": 5,
    # Cron schedules: name -> {"cron", "job_type", "payload", and enqueue options} (docs/schedules.md).
    "SCHEDULES": {},
    # How often (seconds) a worker looks for expired leases; None means LEASE_SECONDS / 2.
    "RECOVERY_INTERVAL": None,
    # PostgreSQL: whether the worker's claims and outcomes wait for the WAL flush. Off, a database
    # crash can undo the last ones, which makes those jobs run again; no job is ever lost.
    "WORKER_SYNCHRONOUS_COMMIT": False,
    # PostgreSQL: "transaction" when DATABASE is reached through a pooler in transaction mode
    # (PgBouncer, Supavisor, RDS Proxy): no prepared statements, no LISTEN on it. "session" when
    # each connection is the worker's own (directly, or a pooler in session mode). None: read it
    # from Django's DISABLE_SERVER_SIDE_CURSORS of that alias (True means "transaction").
    "POOLER": None,
    # PostgreSQL: the alias (with the same database) the worker LISTENs on for wake-ups; None:
    # DATABASE, unless it is behind a transaction pooler, where workers poll instead.
    "LISTEN_DATABASE": None,
    # SQLite aliases besides the queue's (DATABASE) whose connections get the queue's set-up:
    # WAL, synchronous=NORMAL, IMMEDIATE transactions, a busy timeout.
    "SQLITE_SETUP_ALIASES": [],
    # Seconds one of the worker's own database calls may go unanswered before its connection is
    # taken for dead, closed and opened again (database/deadline.py); None turns the deadline off.
    "STATEMENT_DEADLINE": 20,
    # Queue limits, across every worker: {"mailers": {"concurrency": 10, "rate_limit": "100/m"}}.
    "QUEUES": {},
    # Seconds a cancelled job's row is kept (visible, retryable) before a worker prunes it.
    "CANCELLED_RETENTION": 7 * 86400,
    # Seconds the per-minute counters (rws_metrics) are kept before they are folded into totals.
    "METRICS_RETENTION": 2 * 86400,
    # A bearer token that may read the Prometheus endpoint (django_rws_jobs.urls); None: staff only.
    "METRICS_TOKEN": None,
    # The most bytes of JSON a batch's metadata (and a job's, enqueue(metadata=)) may take.
    "METADATA_MAX_BYTES": 65536,
    # The most bytes of JSON a batch member may keep with current_job().record(value).
    "OUTPUT_MAX_BYTES": 65536,
    # Seconds between two writes of a running job's saved cursors (current_job().iterate): a
    # kill -9 loses at most this much of a long job's progress (running/checkpoints.py).
    "CHECKPOINT_INTERVAL": 5,
    # Seconds a finished or cancelled batch's row is kept (counts, outcome) before a worker prunes it.
    "BATCH_RETENTION": 7 * 86400,
    # Classes around enqueuing and running jobs, outermost first (queue/middleware.py).
    "MIDDLEWARE": [],
    # OpenTelemetry (django_rws_jobs.tracing): a job's "process" span is "link"ed to its enqueue's
    # "send" span (a trace of its own), or its "child" (in the enqueue's trace).
    "OTEL_PARENT": "link",
}


class JobsSettings:
    """Attribute access to RWS_JOBS with defaults; nothing is cached."""

    def _user(self) -> dict[str, Any]:
        value = getattr(settings, "RWS_JOBS", {})
        return value if isinstance(value, dict) else {}

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"RWS_JOBS has no setting {name!r}")
        return self._user().get(name, DEFAULTS[name])

    @property
    def recovery_interval(self) -> float:
        value = self.RECOVERY_INTERVAL
        return float(value) if value is not None else max(float(self.LEASE_SECONDS) / 2, 0.5)


jobs_settings = JobsSettings()
