"""The dispatcher's deletion of succeeded jobs with its next claim (Store.finish_and_claim): on
SQLite in the claim's transaction, on PostgreSQL in the claim's own query (ScopedCursor.defer), on
MariaDB after the claim's BEGIN in its first call (mysql.DeferringCursor); either way both are
written or neither."""

import os

import pytest
from django.db import connection

import django_rws_jobs as rws
from django_rws_jobs.database import clock
from django_rws_jobs.database.connections import private_connection
from django_rws_jobs.models import Job, Status
from django_rws_jobs.queue.store import Store

pytestmark = pytest.mark.django_db(transaction=True)

postgres_only = pytest.mark.skipif(
    os.environ.get("RWS_TEST_DB", "sqlite") != "postgres", reason="ScopedCursor: PostgreSQL only"
)


@pytest.fixture
def store():
    conn = private_connection("default")
    try:
        yield Store(conn)
    finally:
        conn.close()


def claim(store, token, n=1):
    now = int(clock.now())
    return store.claim(token, now, now + 60, None, n)


def test_finish_and_claim_deletes_the_finished_jobs_and_claims_the_next(store):
    first = [rws.enqueue("test.record", str(i)) for i in range(2)]
    finished = claim(store, "w:1:x#1", 2)
    assert sorted(job.id for job in finished) == sorted(first)
    waiting = rws.enqueue("test.record", "next")
    now = int(clock.now())
    done, claimed = store.finish_and_claim(finished, "w:1:x#2", now, now + 60, None, 4)
    assert done == set(first)
    assert [job.id for job in claimed] == [waiting]
    assert list(Job.objects.values_list("id", "status")) == [(waiting, Status.RUNNING)]


def test_a_finished_job_another_claim_took_is_not_deleted(store):
    """The deletion is fenced on the claim: a job whose lease another worker took over stays."""
    job_id = rws.enqueue("test.record", "x")
    (job,) = claim(store, "w:1:x#1")
    Job.objects.filter(id=job_id).update(locked_by="w:2:y#1")
    now = int(clock.now())
    done, claimed = store.finish_and_claim([job], "w:1:x#2", now, now + 60, None, 1)
    assert (done, claimed) == (set(), [])
    assert Job.objects.get(id=job_id).locked_by == "w:2:y#1"


@pytest.mark.skipif(
    os.environ.get("RWS_TEST_DB", "sqlite") == "sqlite"
    or os.environ.get("RWS_TEST_MYSQL_DRIVER") == "pymysql",
    reason="PostgreSQL's simple query, MariaDB's several statements per call",
)
def test_finish_and_claim_sends_the_deletions_with_the_claim(store):
    """The deletions ride in the claim's first call: on PostgreSQL one call in all, not two; on
    MariaDB the claim's two (BEGIN, the deletions and the locking read; the UPDATE and COMMIT),
    not three."""
    rws.enqueue_many([("test.record", str(i)) for i in range(4)])
    first = claim(store, "w:1:x#1")
    now = int(clock.now())
    store.finish_and_claim(first, "w:1:x#2", now, now + 60, None, 1)  # prepares what it sends
    second = claim(store, "w:1:x#3")
    sent = []

    class Counting:
        """The driver's cursor, counting what is sent through it."""

        def __init__(self, raw):
            self.raw = raw

        def execute(self, query, *args, **kwargs):
            sent.append(query)
            return self.raw.execute(query, *args, **kwargs)

        def __getattr__(self, name):
            return getattr(self.raw, name)

    with store.cursor() as c:
        raw = c.cursor
        c.cursor = Counting(raw)
        try:
            done, claimed = store.finish_and_claim(second, "w:1:x#4", now, now + 60, None, 1)
        finally:
            c.cursor = raw
    assert done == {second[0].id} and len(claimed) == 1
    assert not Job.objects.filter(id=second[0].id).exists()
    if connection.vendor == "postgresql":
        assert len(sent) == 1, sent
    else:
        assert len(sent) == 2, sent
        assert sent[0].startswith("BEGIN; DELETE FROM rws_jobs"), sent[0]


@postgres_only
def test_deletes_sent_with_a_claim_roll_back_with_it(store):
    """A statement that fails takes the deletions sent with it back; none is left for the next."""
    job_id = rws.enqueue("test.record", "x")
    (job,) = claim(store, "w:1:x#1")
    with store.cursor() as c:
        delete = store.backend.complete_delete([job.id], job.token)
        c.defer(delete.text, delete.params)
        with pytest.raises(Exception, match="division by zero"):
            c.execute("SELECT 1 / 0")
        assert Job.objects.get(id=job_id).status == Status.RUNNING
        c.defer(delete.text, delete.params)
        c.drop_deferred()
        c.execute("SELECT 1")
        assert c.fetchone() == (1,)
    assert Job.objects.get(id=job_id).status == Status.RUNNING
    assert connection.vendor == "postgresql"
