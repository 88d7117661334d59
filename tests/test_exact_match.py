"""Names and ids match exactly on every database, whatever its default collation.

On MariaDB the test database is created with the server's defaults (utf8mb4_general_ci: case-
and accent-insensitive, every 4-byte character equal to every other, trailing spaces ignored), as
a user's database is; migration 0007 gives the compared columns a binary, no-pad collation.
"""

import time

import pytest
from django.db import connection
from django.urls import reverse

import django_rws_jobs as rws
from django_rws_jobs.models import Job, JobSchedule

pytestmark = pytest.mark.django_db(transaction=True)

# (the name asked for, a name that general_ci or PAD SPACE takes for the same)
LOOKALIKES = [("Mail", "mail"), ("🔥", "💧"), ("é", "e"), ("reports  ", "reports"), ("ß", "ss")]


def make(job_id: str, *, status: str = "pending", **fields: object) -> Job:
    t = int(time.time())
    fields.setdefault("job_type", "test.record")
    return Job.objects.create(id=job_id, status=status, next_run_at=t, created_at=t, **fields)


@pytest.mark.parametrize("wanted, other", [pair for pair in LOOKALIKES if pair[0].strip() == pair[0]])
def test_tick_takes_only_jobs_of_the_queue_named_exactly(runs, wanted, other):
    rws.enqueue("test.record", "other", queue=other)
    assert rws.tick(queues=[wanted]) is False
    assert rws.tick(queues=[wanted, "unused"]) is False  # several queues: an IN list
    rws.enqueue("test.record", "wanted", queue=wanted)
    assert rws.tick(queues=[wanted]) is True and rws.tick(queues=[wanted]) is False
    assert runs() == [("record", "wanted")]
    assert Job.objects.get().queue == other


def test_tick_does_not_take_a_queue_for_one_named_with_trailing_spaces(runs):
    """PAD SPACE collations (MariaDB's utf8mb4_general_ci and utf8mb4_bin alike) ignore them."""
    rws.enqueue("test.record", "reports", queue="reports")
    for asked in (["reports  "], ["reports ", "unused"]):
        try:
            took = rws.tick(queues=asked)
        except ValueError:  # (a queue name with edge spaces may be refused outright)
            took = False
        assert took is False, asked
    assert runs() == [] and rws.tick(queues=["reports"]) is True


@pytest.mark.parametrize("wanted, other", LOOKALIKES)
def test_each_compared_column_matches_exactly(wanted, other):
    make("j1", job_type=other, queue=other, unique_key=other, locked_by=other)
    JobSchedule.objects.create(name=other, next_run_at=0)
    for column in ("job_type", "queue", "unique_key", "locked_by"):
        assert not Job.objects.filter(**{column: wanted}).exists(), column
        assert Job.objects.filter(**{column: other}).exists(), column
    assert not JobSchedule.objects.filter(name=wanted).exists()
    # Both may be held at once: the primary keys tell them apart.
    make(other)
    make(wanted)
    JobSchedule.objects.create(name=wanted, next_run_at=0)
    assert Job.objects.get(id=wanted).id == wanted and JobSchedule.objects.count() == 2


def test_retry_and_delete_take_only_the_id_named_exactly():
    make("Job-1", status="failed")
    make("job-2", status="failed")
    assert rws.retry("job-1") is False and rws.retry("Job-1 ") is False
    assert rws.delete("JOB-2") is False and rws.delete("job-2 ") is False
    assert sorted(Job.objects.values_list("id", "status")) == [("Job-1", "failed"), ("job-2", "failed")]
    assert rws.retry("Job-1") is True and rws.delete("job-2") is True


def test_the_overview_counts_queues_that_differ_only_in_case_apart(admin_client):
    make("a1", queue="A")
    make("a2", queue="a")
    make("a3", queue="a", status="failed")
    make("a4", queue="a ")
    response = admin_client.get(reverse("admin:django_rws_jobs_job_overview"))
    rows = {r["stats"].queue: r["stats"] for r in response.context["rows"]}
    assert {q: (s.pending, s.failed) for q, s in rows.items()} == {"A": (1, 0), "a": (1, 1), "a ": (1, 0)}


@pytest.mark.parametrize("wanted, other", LOOKALIKES)
def test_concurrency_keys_that_differ_only_by_collation_are_two_keys(wanted, other):
    from django.db import transaction

    from django_rws_jobs.flow.concurrency_keys import promote
    from django_rws_jobs.queue.store import Store

    with transaction.atomic():  # (enqueue's own promotion waits for the commit)
        a = rws.enqueue("test.keyed", "a", concurrency_key=wanted)
        b = rws.enqueue("test.keyed", "b", concurrency_key=other)
        assert promote(Store(connection), [wanted, other], int(time.time()), in_transaction=True) == 2
    assert set(Job.objects.filter(id__in=[a, b]).values_list("status", "concurrency_slot")) == {
        ("pending", 0)
    }
    assert Job.objects.filter(concurrency_key=wanted).count() == 1


@pytest.mark.skipif(connection.vendor != "mysql", reason="MariaDB/MySQL collations")
def test_the_database_default_is_the_servers_and_the_columns_are_binary_no_pad():
    with connection.cursor() as c:
        c.execute("SELECT @@collation_database, @@collation_server")
        database, server = c.fetchone()
        c.execute(
            "SELECT table_name, column_name, collation_name FROM information_schema.columns "
            "WHERE table_schema = DATABASE() AND table_name IN ('rws_jobs', 'rws_job_schedules') "
            "AND collation_name IS NOT NULL"
        )
        collations = {(t, col): coll for t, col, coll in c.fetchall()}
        c.execute("SELECT 'a ' = 'a' COLLATE utf8mb4_nopad_bin, 'a ' = 'a' COLLATE utf8mb4_bin")
        nopad, padded = c.fetchone()
    assert database == server  # the tests run where users do (tests/settings.py)
    exact = "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"
    for column in ("id", "job_type", "queue", "unique_key", "locked_by", "concurrency_key"):
        assert collations[("rws_jobs", column)] == exact, column
    assert collations[("rws_job_schedules", "name")] == exact
    assert (nopad, padded) == (0, 1)  # why not utf8mb4_bin: it pads


#: Text columns of the app's tables that name nothing the queue looks rows up by: every other
#: text column must compare exactly (migrations 0007, 0008, 0011 and 0015). A new table's name
#: columns then cannot miss it: the test below fails until the column is made exact or listed
#: here with its reason.
NOT_NAMES = {
    ("rws_jobs", "payload"): "the handler's input",
    ("rws_jobs", "status"): "a fixed vocabulary of lowercase words",
    ("rws_jobs", "last_error"): "text for people",
    ("rws_jobs", "traceback"): "text for people",
    ("rws_jobs", "task_history"): "JSON, read whole",
    ("rws_jobs", "unique_hash"): "a lowercase hex digest: no two differ by case, accents or padding",
    ("rws_jobs", "cancelled_by"): "text for people",
    ("rws_job_schedules", "cron"): "compared in Python",
    ("rws_task_results", "payload"): "JSON, read whole",
    ("rws_task_results", "return_value"): "JSON, read whole",
    ("rws_task_results", "history"): "JSON, read whole",
    ("rws_workers", "queues"): "comma-separated, split in Python",
    ("rws_workers", "pool"): "a fixed vocabulary of lowercase words",
    ("rws_workers", "version"): "text for people",
    ("rws_workers", "running"): "JSON, read whole",
    ("rws_jobs", "batch_event"): "a fixed vocabulary of lowercase words",
    ("rws_batches", "description"): "text for people",
    ("rws_batches", "metadata"): "JSON, read whole",
    ("rws_batches", "callbacks"): "JSON, read whole",
    ("rws_batches", "state"): "a fixed vocabulary of lowercase words",
    ("rws_batches", "outcome"): "a fixed vocabulary of lowercase words",
    ("rws_batch_members", "outcome"): "a fixed vocabulary of lowercase words",
    ("rws_batch_outputs", "value"): "JSON, read whole",
    ("rws_jobs", "progress"): "JSON, read whole",
    ("rws_jobs", "checkpoint"): "JSON, read whole",
    ("rws_job_dependencies", "policy"): "a fixed vocabulary of lowercase words",
    ("rws_job_dependencies", "outcome"): "a fixed vocabulary of lowercase words",
}


def _text_columns() -> set[tuple[str, str]]:
    from django.apps import apps
    from django.db import models

    columns = set()
    for model in apps.get_app_config("django_rws_jobs").get_models():
        if model._meta.proxy or not model._meta.managed:
            continue
        for field in model._meta.concrete_fields:
            if isinstance(field, models.CharField | models.TextField):
                columns.add((model._meta.db_table, field.column))
    return columns


def test_every_compared_column_is_exact():
    text_columns = _text_columns()
    assert set(NOT_NAMES) <= text_columns, set(NOT_NAMES) - text_columns  # no stale entry
    compared = text_columns - set(NOT_NAMES)
    assert ("rws_queues", "name") in compared and ("rws_metrics", "job_type") in compared
    if connection.vendor != "mysql":
        return
    with connection.cursor() as c:
        c.execute(
            "SELECT table_name, column_name, collation_name FROM information_schema.columns "
            "WHERE table_schema = DATABASE() AND collation_name IS NOT NULL"
        )
        collations = {(t, col): coll for t, col, coll in c.fetchall()}
    exact = "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"
    loose = sorted(
        f"{t}.{col} ({collations.get((t, col))})" for t, col in compared if collations.get((t, col)) != exact
    )
    assert not loose, f"columns that name things but do not compare exactly: {', '.join(loose)}"


@pytest.mark.parametrize("wanted, other", [pair for pair in LOOKALIKES if pair[0].strip() == pair[0]])
def test_pausing_a_queue_pauses_only_the_queue_named_exactly(wanted, other):
    rws.pause_queue(other)
    assert rws.paused_queues() == [other]
    rws.resume_queue(wanted)  # a lookalike's resume leaves it paused
    assert rws.paused_queues() == [other]
    rws.pause_queue(wanted)
    assert sorted(rws.paused_queues()) == sorted([wanted, other])
    rws.resume_queue(other)
    assert rws.paused_queues() == [wanted]


def test_a_queue_paused_after_its_lookalike_starts_nothing(runs):
    rws.pause_queue("Mail")
    rws.pause_queue("mail")
    rws.enqueue("test.record", "mail's", queue="mail")
    assert rws.tick() is False and runs() == []
    rws.resume_queue("mail")
    assert rws.tick() is True and runs() == [("record", "mail's")]


@pytest.mark.parametrize("wanted, other", [pair for pair in LOOKALIKES if pair[0].strip() == pair[0]])
def test_limited_queues_that_differ_only_by_collation_have_their_own_windows(wanted, other):
    from django_rws_jobs.flow.limited_claims import claim_limited
    from django_rws_jobs.flow.limits import QueueLimits
    from django_rws_jobs.queue.store import Store

    store = Store(connection)
    limits = QueueLimits(rate=1, period=3600)
    for queue in (wanted, other):
        rws.enqueue("test.record", queue, queue=queue)
        rws.enqueue("test.record", queue, queue=queue)
    now = int(time.time())
    took = {}
    for queue in (wanted, other):
        claimed, left = claim_limited(store, queue, limits, "tok", now, now + 60, 5)
        took[queue] = ([job.queue for job in claimed], left)
    assert took == {wanted: ([wanted], True), other: ([other], True)}


@pytest.mark.parametrize("wanted, other", LOOKALIKES)
def test_metrics_of_lookalike_queues_and_job_types_are_kept_apart(wanted, other):
    from django_rws_jobs.models import MetricMinute
    from django_rws_jobs.operations import metrics
    from django_rws_jobs.queue.store import Store

    done = metrics.ADDS.index("done")
    width = len(metrics.ADDS) + len(metrics.MAXES)

    def row(queue: str, job_type: str, n: int) -> list[object]:
        values: list[object] = [0] * width
        values[done] = n
        return [600, queue, job_type, *values]

    metrics.write(Store(connection), [row(wanted, "app.send", 1), row(other, "app.send", 2)])
    metrics.write(Store(connection), [row("q", wanted, 3), row("q", other, 4)])
    got = set(MetricMinute.objects.values_list("queue", "job_type", "done"))
    assert got == {(wanted, "app.send", 1), (other, "app.send", 2), ("q", wanted, 3), ("q", other, 4)}
