"""The queue's tables: ``rws_jobs`` and ``rws_job_schedules`` (shared with rust-web-server)."""

from __future__ import annotations

import time
from collections.abc import Callable

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _


def _host_now(using: str | None = None) -> float:
    return time.time()


#: The queue's time (unix seconds) for an alias: ``clock.now``, set by the app's ``ready()``.
#: The clock reads the server's time through the backends, which import this module, so this
#: module is handed the clock instead of importing it (tests/test_imports.py).
queue_now: Callable[[str | None], float] = _host_now


class Status(models.TextChoices):
    """A job's state, and who moves it.

    ``pending``: written by ``enqueue``, by a failed attempt that will be retried, by recovery of an
    expired lease and by ``retry``; left by a worker's claim. ``running``: set by a claim; left by
    the worker's outcome (row deleted, back to pending, or failed) or by recovery. ``failed``: the
    dead-letter list, set when attempts exceed max_retries; left by ``retry`` or ``delete``.
    ``cancelled``: set by ``cancel()`` on a pending or waiting job, or by the worker that held a
    running one whose cancel was requested (``cancel_requested_at``); left by ``retry`` or
    ``delete``, or pruned after CANCELLED_RETENTION (cancellation.py).
    ``waiting``: a job with a concurrency key, in every place where one without a key would be
    pending; left only for pending, by the promotion that gives it one of its key's slots
    (concurrency_keys.py).
    ``blocked``: enqueued with ``after=``, until what it waits for has succeeded; left for pending
    (or waiting) or cancelled by the resolution of its dependencies (dependencies.py). No claim
    reads it.
    """

    PENDING = "pending", _("pending")
    RUNNING = "running", _("running")
    FAILED = "failed", _("failed")
    WAITING = "waiting", _("waiting")
    CANCELLED = "cancelled", _("cancelled")
    BLOCKED = "blocked", _("blocked")


#: The order in which jobs are claimed, as ``order_by`` takes it: highest priority first, then the
#: earliest due, the oldest, the smallest id. The claim's SQL, its Python sort keys and the claim
#: indexes below are built from it (backends/statements.py).
CLAIM_ORDER = ("-priority", "next_run_at", "created_at", "id")
#: CLAIM_ORDER's columns, without the direction.
CLAIM_ORDER_COLUMNS = tuple(name.lstrip("-") for name in CLAIM_ORDER)


class JobQuerySet(models.QuerySet):
    def pending(self) -> JobQuerySet:
        return self.filter(status=Status.PENDING)

    def running(self) -> JobQuerySet:
        return self.filter(status=Status.RUNNING)

    def failed(self) -> JobQuerySet:
        return self.filter(status=Status.FAILED)

    def waiting(self) -> JobQuerySet:
        return self.filter(status=Status.WAITING)

    def due(self, now: int | None = None) -> JobQuerySet:
        """Pending jobs whose time has come (``now`` in unix seconds)."""
        now = int(queue_now(self.db)) if now is None else now
        return self.filter(status=Status.PENDING, next_run_at__lte=now)

    def lease_expired(self, now: int | None = None) -> JobQuerySet:
        """Running jobs whose holder stopped renewing its lease."""
        now = int(queue_now(self.db)) if now is None else now
        return self.filter(status=Status.RUNNING).filter(
            Q(locked_until__lt=now) | Q(locked_until__isnull=True)
        )

    def in_queue_order(self) -> JobQuerySet:
        return self.order_by(*CLAIM_ORDER)


class Job(models.Model):
    """One row of ``rws_jobs``. rust-web-server's columns come first; the rest are ours, all nullable."""

    id = models.CharField(max_length=64, primary_key=True)
    job_type = models.TextField()
    payload = models.TextField(db_default="", default="", blank=True)
    status = models.CharField(
        max_length=16, choices=Status.choices, db_default=Status.PENDING, default=Status.PENDING
    )
    attempts = models.IntegerField(db_default=0, default=0, help_text=_("attempts that failed so far"))
    max_retries = models.IntegerField(
        db_default=3, default=3, help_text=_("retries allowed after the first attempt")
    )
    next_run_at = models.BigIntegerField(help_text=_("unix seconds: when it is (or was last) due"))
    created_at = models.BigIntegerField(help_text=_("unix seconds"))
    last_error = models.TextField(null=True, blank=True)
    queue = models.CharField(max_length=64, db_default="default", default="default")
    priority = models.BigIntegerField(db_default=0, default=0, help_text=_("higher runs first"))
    unique_key = models.CharField(max_length=191, null=True, blank=True)

    # Ours. sha256(job_type, unique_key) while the job is pending or running, NULL otherwise: a
    # plain unique index on it enforces unique jobs the same way on every database (MySQL has no
    # partial indexes, and job_type is TEXT, which it cannot index whole).
    unique_hash = models.CharField(max_length=64, null=True, blank=True, editable=False)
    # The claim holding a running job (worker id and claim number) and until when (unix seconds).
    locked_by = models.CharField(max_length=128, null=True, blank=True)
    locked_until = models.BigIntegerField(null=True, blank=True)
    started_at = models.BigIntegerField(null=True, blank=True, help_text=_("unix seconds: last claim"))
    failed_at = models.BigIntegerField(null=True, blank=True, help_text=_("unix seconds: moved to dead"))
    traceback = models.TextField(null=True, blank=True)
    # Task rows only (django_rws_jobs.tasks): JSON of the errors, worker ids and times of the
    # attempts so far. Written by outcome writes, never by the claim (tasks/history.py).
    task_history = models.TextField(null=True, blank=True, editable=False)
    # This job's own time limit (enqueue(timeout=)); NULL: its type's, else RWS_JOBS["TIMEOUT"].
    timeout = models.FloatField(null=True, blank=True, help_text=_("seconds; empty: the job type's limit"))
    # Per-key concurrency (enqueue(concurrency_key=)): at most concurrency_limit jobs with one key
    # are pending or running. Each of them holds a slot, a number below the limit, and the unique
    # constraint below lets no two hold the same one; waiting and failed rows hold none.
    concurrency_key = models.CharField(max_length=191, null=True, blank=True)
    concurrency_limit = models.IntegerField(null=True, blank=True, help_text=_("empty: 1"))
    concurrency_slot = models.IntegerField(null=True, blank=True, editable=False)
    # Cancelling (cancellation.py): a running job's request, then when and by whom it ended.
    cancel_requested_at = models.BigIntegerField(null=True, blank=True, help_text=_("unix seconds"))
    cancelled_at = models.BigIntegerField(null=True, blank=True, help_text=_("unix seconds"))
    cancelled_by = models.CharField(max_length=191, null=True, blank=True)
    # Batches (api/batches.py): the batch a member belongs to, or whose callback this job is;
    # a callback's event ("success", "failure", "finish"), NULL for a member. Membership itself
    # is the rws_batch_members row, which outlives the job's row.
    batch_id = models.CharField(max_length=64, null=True, blank=True)
    batch_event = models.CharField(max_length=16, null=True, blank=True)
    # Set once a job enqueued with after= waits for this one (dependencies.py): the worker that
    # ends it resolves its dependents at once; the deletion of a finished job returns it.
    has_dependents = models.BooleanField(null=True, blank=True, editable=False)
    # What the job carries and tells (running/context.py): metadata from enqueue(metadata=), kept
    # by save_metadata(); the last progress a handler reported and when (running/reports.py). Both
    # written while the job runs only by its claim's holder (fenced on locked_by).
    metadata = models.JSONField(null=True, blank=True)
    progress = models.TextField(
        null=True, blank=True, editable=False, help_text=_("JSON: current, total, message")
    )
    progress_at = models.FloatField(null=True, blank=True, editable=False, help_text=_("unix seconds"))
    # Times its handler raised Snooze (attempts/outcomes.py): a snooze charges no attempt.
    snoozes = models.IntegerField(null=True, blank=True, editable=False, help_text=_("times it snoozed"))
    # A long job's saved state (running/checkpoints.py): its steps' results and its loops' cursors,
    # written only by its claim's holder (fenced on locked_by); the times it was handed back at a
    # worker's stop and resumed. Both ours, nullable: the Rust crate neither reads nor writes them.
    checkpoint = models.TextField(
        null=True, blank=True, editable=False, help_text=_("JSON: steps' results and loops' cursors")
    )
    resumptions = models.IntegerField(
        null=True, blank=True, editable=False, help_text=_("times it was handed back at a stop")
    )
    # A debounced job's latest due time (api/enqueue_once.py): the first enqueue of its burst plus
    # max_delay; a replace never makes it due later. Ours, nullable.
    due_by = models.BigIntegerField(
        null=True, blank=True, editable=False, help_text=_("unix seconds: due no later (max_delay)")
    )

    objects = JobQuerySet.as_manager()

    class Meta:
        db_table = "rws_jobs"
        verbose_name = _("job")
        verbose_name_plural = _("jobs")
        permissions = [("cancel_job", _("Can cancel jobs"))]
        indexes = [
            # The claim: for each priority band, due rows in order are one range that LIMIT stops,
            # and the next band is one probe (see backends.base.BaseBackend.claim); future rows lie past it.
            models.Index(fields=["status", *CLAIM_ORDER_COLUMNS], name="rws_jobs_claim_idx"),
            # Is anything due at all (an idle worker's first look), and in which band, when many
            # bands hold only future jobs: a range over due rows only.
            models.Index(fields=["status", "next_run_at", "priority"], name="rws_jobs_due_idx"),
            # The claim of a worker that serves one queue (--queue): the same bands, within the
            # queue, so other queues' backlogs lie outside its ranges.
            models.Index(fields=["status", "queue", *CLAIM_ORDER_COLUMNS], name="rws_jobs_queue_idx"),
            # No index for lease recovery (migration 0006 dropped rws_jobs_lease_idx): it reads
            # the 'running' range of the indexes above (the running jobs' rows), while an index
            # of its own cost every claim and every deletion more index writes. Their plans are
            # pinned by tests/test_explain.py's
            # test_lease_statements_read_only_running_rows_with_a_million_future_rows.
            # The promotion of a key's waiting jobs, in claim order, and the keys that have any.
            # Where the database has partial indexes, migration 0011 keeps only waiting rows in it.
            models.Index(
                fields=["concurrency_key", "-priority", "next_run_at", "created_at", "id"],
                name="rws_jobs_waiting_idx",
            ),
        ]
        constraints = [
            models.UniqueConstraint(fields=["unique_hash"], name="rws_jobs_unique_active"),
            # No two jobs with one key hold one slot (NULLs are distinct: rows without a key or a
            # slot never conflict). Partial where the database can (migration 0011).
            models.UniqueConstraint(
                fields=["concurrency_key", "concurrency_slot"], name="rws_jobs_key_slot_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job_type} {self.id} ({self.status})"

    @property
    def is_dead(self) -> bool:
        return self.status == Status.FAILED


class FailedJobManager(models.Manager):
    def get_queryset(self) -> JobQuerySet:
        return JobQuerySet(self.model, using=self._db).filter(status=Status.FAILED)


class FailedJob(Job):
    """The dead-letter list: jobs that exhausted their retries."""

    objects = FailedJobManager()

    class Meta:
        proxy = True
        verbose_name = _("dead job")
        verbose_name_plural = _("dead-letter list")


class JobSchedule(models.Model):
    """One row of ``rws_job_schedules``: the next unclaimed due time of a cron schedule."""

    name = models.CharField(max_length=191, primary_key=True)
    next_run_at = models.BigIntegerField(help_text=_("unix seconds: next unclaimed due time"))
    # Ours: the expression that computed next_run_at, so a changed one takes effect at once.
    # NULL on rows a rust-web-server writer made; those are treated as changed.
    cron = models.CharField(max_length=255, null=True, blank=True)

    class Meta:
        db_table = "rws_job_schedules"
        verbose_name = _("schedule")
        verbose_name_plural = _("schedules")

    def __str__(self) -> str:
        return self.name


class BatchState(models.TextChoices):
    """A batch's state (api/batches.py). ``open``: jobs are being added (the ``with`` block runs);
    ``sealed``: the block ended, the batch finishes once no member is outstanding; ``finished``:
    its callbacks were enqueued (``retry_failed`` seals it again, one generation later);
    ``cancelled``: ``cancel()`` or an exception in the block, no callback fires."""

    OPEN = "open", _("open")
    SEALED = "sealed", _("sealed")
    FINISHED = "finished", _("finished")
    CANCELLED = "cancelled", _("cancelled")


class BatchRecord(models.Model):
    """One row of ``rws_batches``: a batch, its callbacks and how many members it was given."""

    id = models.CharField(max_length=64, primary_key=True)
    description = models.TextField(db_default="", default="", blank=True)
    metadata = models.TextField(null=True, blank=True, help_text=_("JSON"))
    # JSON: {"success": [row, ...], "failure": [...], "finish": [...]}, each row a callback's
    # INSERT parameters as api.prepare made them when call() was given (batches.call).
    callbacks = models.TextField(db_default="{}", default="{}")
    state = models.CharField(
        max_length=16, choices=BatchState.choices, db_default=BatchState.OPEN, default=BatchState.OPEN
    )
    outcome = models.CharField(max_length=16, null=True, blank=True, help_text=_("succeeded or failed"))
    fail_fast = models.BooleanField(db_default=False, default=False)
    # Bumped by retry_failed: a finish decided before it cannot be written after it.
    generation = models.IntegerField(db_default=0, default=0)
    total = models.BigIntegerField(db_default=0, default=0, help_text=_("members added"))
    created_at = models.BigIntegerField(help_text=_("unix seconds"))
    sealed_at = models.BigIntegerField(null=True, blank=True, help_text=_("unix seconds"))
    finished_at = models.BigIntegerField(null=True, blank=True, help_text=_("unix seconds"))

    class Meta:
        db_table = "rws_batches"
        verbose_name = _("batch")
        verbose_name_plural = _("batches")
        indexes = [
            # The sweep of sealed batches, and the pruning of finished ones by age.
            models.Index(fields=["state", "finished_at"], name="rws_batches_state_idx"),
        ]

    def __str__(self) -> str:
        return f"batch {self.id} ({self.state})"


class BatchMember(models.Model):
    """One row of ``rws_batch_members``: a member that has not succeeded. Deleted when it
    succeeds; ``outcome`` is NULL while it is outstanding, else failed or cancelled."""

    job_id = models.CharField(max_length=64, primary_key=True)
    batch_id = models.CharField(max_length=64)
    outcome = models.CharField(max_length=16, null=True, blank=True)

    class Meta:
        db_table = "rws_batch_members"
        verbose_name = _("batch member")
        verbose_name_plural = _("batch members")
        default_permissions = ()
        indexes = [
            # "Is any member outstanding?" and the counts: a range of one batch's rows.
            models.Index(fields=["batch_id", "outcome"], name="rws_batch_members_idx"),
        ]


class UniqueWindow(models.Model):
    """One row of ``rws_unique_windows``: a throttled key (``enqueue(unique=, unique_for=)``) is
    taken until ``until`` by job ``job_id``, whose row may be gone (api/enqueue_once.py). The
    workers delete rows whose window has passed."""

    unique_hash = models.CharField(max_length=64, primary_key=True)
    job_id = models.CharField(max_length=64)
    until = models.BigIntegerField(help_text=_("unix seconds"))

    class Meta:
        db_table = "rws_unique_windows"
        verbose_name = _("unique window")
        verbose_name_plural = _("unique windows")
        default_permissions = ()
        indexes = [models.Index(fields=["until"], name="rws_unique_windows_until_idx")]


class BatchOutput(models.Model):
    """One row of ``rws_batch_outputs``: what member ``job_id`` passed to
    ``current_job().record(value)`` (JSON), the last attempt's; read by ``Batch.outputs()``."""

    job_id = models.CharField(max_length=64, primary_key=True)
    batch_id = models.CharField(max_length=64)
    value = models.TextField()
    recorded_at = models.BigIntegerField()

    class Meta:
        db_table = "rws_batch_outputs"
        verbose_name = _("batch output")
        verbose_name_plural = _("batch outputs")
        default_permissions = ()
        indexes = [
            # Batch.outputs(): one batch's rows in job id order, a page at a time.
            models.Index(fields=["batch_id", "job_id"], name="rws_batch_outputs_idx"),
        ]


class Dependency(models.Model):
    """One row of ``rws_job_dependencies``: job ``job_id`` waits for ``depends_on`` (a job, or a
    batch when ``on_batch``). ``outcome`` is NULL until that ends, then succeeded or failed;
    ``policy`` says what a failure does to the waiting job: cancel, run or wait."""

    pk = models.CompositePrimaryKey("job_id", "depends_on")
    job_id = models.CharField(max_length=64)
    depends_on = models.CharField(max_length=64)
    on_batch = models.BooleanField(db_default=False, default=False)
    policy = models.CharField(max_length=8, db_default="cancel", default="cancel")
    outcome = models.CharField(max_length=16, null=True, blank=True)

    class Meta:
        db_table = "rws_job_dependencies"
        verbose_name = _("dependency")
        verbose_name_plural = _("dependencies")
        default_permissions = ()
        indexes = [
            # What waits for a job or batch that just ended.
            models.Index(fields=["depends_on"], name="rws_job_dependencies_on_idx"),
        ]


class Queue(models.Model):
    """One row of ``rws_queues``: what an operator set on a queue (a pause), and the bookkeeping of
    its rate limit. A queue needs no row to exist: jobs name their queue, and a queue without a
    row is not paused."""

    name = models.CharField(max_length=64, primary_key=True)
    paused = models.BooleanField(db_default=False, default=False)
    paused_at = models.BigIntegerField(null=True, blank=True, help_text=_("unix seconds: last paused"))
    # A rate limit's log (RWS_JOBS["QUEUES"]): the queue's last starts, a ring of QueueStart rows
    # with slots 0 to rate_slots - 1, in the order they were written from rate_next (the oldest,
    # the next to write) round; written by the claims of the queue under its row's lock
    # (limited_claims.py).
    rate_slots = models.IntegerField(db_default=0, default=0, help_text=_("the rate log's size"))
    rate_next = models.IntegerField(db_default=0, default=0, help_text=_("the rate log's next slot"))

    class Meta:
        db_table = "rws_queues"
        verbose_name = _("queue")
        verbose_name_plural = _("queues")
        default_permissions = ()
        permissions = [("pause_queue", _("Can pause and resume queues"))]

    def __str__(self) -> str:
        return self.name


class QueueStart(models.Model):
    """One row of ``rws_queue_starts``: one start in the log of a queue's rate limit, the time a
    claim of the queue took a job, by the queue's clock. A queue's rows are a ring written in the
    order of time (limited_claims.py); a slot is written the first time it is used, so a large
    limit costs rows only as jobs start."""

    pk = models.CompositePrimaryKey("queue", "slot")
    queue = models.CharField(max_length=64)
    slot = models.IntegerField()
    started_us = models.BigIntegerField(help_text=_("unix microseconds"))

    class Meta:
        db_table = "rws_queue_starts"
        verbose_name = _("queue start")
        verbose_name_plural = _("queue starts")
        default_permissions = ()


class TaskResultRecord(models.Model):
    """One row of ``rws_task_results``: a task that succeeded, written in the transaction that
    deleted its job row (tasks/outcomes.py)."""

    id = models.CharField(max_length=64, primary_key=True)
    task_path = models.TextField(help_text=_("the task function's module path"))
    queue = models.CharField(max_length=64)
    priority = models.BigIntegerField()
    payload = models.TextField(help_text=_("JSON: args, kwargs, backend, run_after, enqueued_at"))
    return_value = models.TextField(help_text=_("JSON"))
    history = models.TextField(help_text=_("JSON: errors, worker ids and times of the attempts"))
    finished_at = models.BigIntegerField(help_text=_("unix seconds"))
    metadata = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "rws_task_results"
        verbose_name = _("task result")
        verbose_name_plural = _("task results")
        indexes = [
            # Pruning deletes the oldest results first, within a queue or in all of them.
            models.Index(fields=["finished_at"], name="rws_task_results_done_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} {self.id}"


class QueueOverview(Job):
    """No data of its own: gives the queue overview page its entry on the admin index."""

    class Meta:
        proxy = True
        verbose_name = _("queue overview")
        verbose_name_plural = _("queue overview")
        default_permissions = ()


class Worker(models.Model):
    """One row of ``rws_workers``: a live ``rws_worker`` process, registered at its start,
    renewed with its leases (``heartbeat_at``, the queue's clock), removed at a clean stop
    (operations/worker_rows.py). A row whose heartbeat is older than three of its intervals is a
    dead worker's."""

    id = models.CharField(max_length=191, primary_key=True, help_text=_("host:pid:random"))
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    queues = models.TextField(blank=True, default="", help_text=_("comma-separated; empty: every queue"))
    pool = models.CharField(max_length=16, help_text=_("threads or processes"))
    executors = models.IntegerField()
    version = models.CharField(max_length=64, help_text=_("django-rws-jobs' version"))
    started_at = models.BigIntegerField(help_text=_("unix seconds"))
    heartbeat_at = models.BigIntegerField(help_text=_("unix seconds: the last renewal"))
    heartbeat_interval = models.FloatField(help_text=_("seconds between heartbeats"))
    running = models.TextField(blank=True, default="[]", help_text=_("JSON: the ids of the jobs it holds"))
    done = models.BigIntegerField(default=0, help_text=_("jobs that succeeded since its start"))
    failed = models.BigIntegerField(default=0, help_text=_("failed attempts since its start"))
    claim_p99 = models.FloatField(
        null=True,
        blank=True,
        help_text=_("seconds: the 99th percentile of its claims' durations between its last two heartbeats"),
    )

    class Meta:
        db_table = "rws_workers"
        verbose_name = _("worker")
        verbose_name_plural = _("workers")
        default_permissions = ("view",)

    def __str__(self) -> str:
        return self.id

    def alive(self, now: int) -> bool:
        """Its heartbeat is at most three intervals old (worker_rows.DEAD_AFTER)."""
        return now - self.heartbeat_at <= 3 * self.heartbeat_interval

    def running_ids(self) -> list[str]:
        import json

        try:
            ids = json.loads(self.running or "[]")
        except ValueError:
            return []
        return [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else []


class MetricMinute(models.Model):
    """One row of ``rws_metrics``: what the workers recorded for one queue and job type in one
    minute of the queue's clock, added to by each worker's completer (metrics.py)."""

    minute = models.BigIntegerField(help_text=_("unix seconds of the minute's start"))
    queue = models.CharField(max_length=64)
    job_type = models.CharField(max_length=191)
    done = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0, help_text=_("failed attempts, the last ones included"))
    dead = models.BigIntegerField(default=0, help_text=_("jobs moved to the dead-letter list"))
    cancelled = models.BigIntegerField(default=0, help_text=_("running jobs cancelled"))
    runs = models.BigIntegerField(default=0, help_text=_("attempts whose run time is counted"))
    run_seconds = models.FloatField(default=0.0, help_text=_("their run time, summed"))
    run_seconds_max = models.FloatField(default=0.0)
    wait_seconds = models.FloatField(default=0.0, help_text=_("from due to start, summed over the runs"))
    snoozed = models.BigIntegerField(default=0, help_text=_("attempts that ended in Snooze"))

    class Meta:
        db_table = "rws_metrics"
        verbose_name = _("metrics minute")
        default_permissions = ()
        constraints = [
            models.UniqueConstraint(fields=["minute", "queue", "job_type"], name="rws_metrics_minute_unique"),
        ]


class MetricTotal(models.Model):
    """One row of ``rws_metric_totals``: the counters of the pruned minutes of one queue and job
    type, so that the Prometheus counters (these plus the minutes) never go down."""

    queue = models.CharField(max_length=64)
    job_type = models.CharField(max_length=191)
    done = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)
    dead = models.BigIntegerField(default=0)
    cancelled = models.BigIntegerField(default=0)
    runs = models.BigIntegerField(default=0)
    run_seconds = models.FloatField(default=0.0)
    run_seconds_max = models.FloatField(default=0.0)
    wait_seconds = models.FloatField(default=0.0)
    snoozed = models.BigIntegerField(default=0)

    class Meta:
        db_table = "rws_metric_totals"
        verbose_name = _("metrics total")
        default_permissions = ()
        constraints = [
            models.UniqueConstraint(fields=["queue", "job_type"], name="rws_metric_totals_unique"),
        ]
