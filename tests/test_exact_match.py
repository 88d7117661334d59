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
    from django_rws_jobs.concurrency_keys import promote
    from django_rws_jobs.store import Store

    a = rws.enqueue("test.keyed", "a", concurrency_key=wanted)
    b = rws.enqueue("test.keyed", "b", concurrency_key=other)
    assert promote(Store(connection), [wanted, other], int(time.time())) == 2  # each its own slot 0
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
