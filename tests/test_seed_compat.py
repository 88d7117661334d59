"""Rows written with rust-web-server's (rust-web-server's) exact SQL share the queue with ours."""

import time

import pytest
from django.db import connection

import django_rws_jobs as rws
from django_rws_jobs.attempts.outcomes import recover
from django_rws_jobs.database.connections import private_connection
from django_rws_jobs.models import Job
from django_rws_jobs.queue.store import Store

pytestmark = pytest.mark.django_db(transaction=True)


def seed(sql: str, params: list) -> int:
    """Run one of rust-web-server's statements (its ? placeholders are Django's %s)."""
    with connection.cursor() as c:
        c.execute(sql.replace("?", "%s"), params)
        return c.rowcount


SEED_INSERT = (
    "INSERT INTO rws_jobs (id, job_type, payload, status, attempts, max_retries, next_run_at, "
    "created_at, queue, priority, unique_key) VALUES (?, ?, ?, 'pending', 0, ?, ?, ?, ?, ?, ?)"
)
SEED_CLAIM = "UPDATE rws_jobs SET status = 'running' WHERE id = ? AND status = 'pending'"
SEED_RESCHEDULE = (
    "UPDATE rws_jobs SET status = 'pending', attempts = ?, last_error = ?, next_run_at = ? WHERE id = ?"
)


def test_a_job_inserted_by_the_seed_is_run_by_our_worker(runs):
    now = int(time.time())
    seed(SEED_INSERT, ["18a1-0", "test.record", "from rust", 3, now, now, "default", 0, None])
    assert rws.tick() is True
    assert runs() == [("record", "from rust")]
    assert not Job.objects.exists()


def test_a_job_we_enqueue_is_claimable_with_the_seeds_sql():
    job_id = rws.enqueue("test.record", "for rust")
    with connection.cursor() as c:
        c.execute(
            "SELECT id, job_type, payload FROM rws_jobs WHERE status = 'pending' AND next_run_at <= %s "
            "ORDER BY priority DESC, next_run_at ASC, created_at ASC LIMIT 1",
            [int(time.time())],
        )
        assert c.fetchone() == (job_id, "test.record", "for rust")
    assert seed(SEED_CLAIM, [job_id]) == 1
    assert seed("DELETE FROM rws_jobs WHERE id = ?", [job_id]) == 1


def test_a_live_seed_claim_is_not_taken_back_even_after_its_retry():
    now = int(time.time())
    seed(SEED_INSERT, ["18a1-1", "test.record", "", 3, now, now, "default", 0, None])
    seed(SEED_CLAIM, ["18a1-1"])
    store = Store(private_connection("default"))
    try:
        # First sight: the lease-less running row gets a lease, and is not taken back yet.
        assert recover(store, now=now) == 0
        first = Job.objects.get(id="18a1-1")
        assert first.status == "running" and first.locked_until == now + 60
        # The Rust worker's attempt failed; it rescheduled and claimed the job again, leaving our
        # columns as they were. Long after that first lease ran out, it is still not taken back.
        seed(SEED_RESCHEDULE, [1, "boom", now + 1, "18a1-1"])
        seed(SEED_CLAIM, ["18a1-1"])
        later = now + 120
        assert recover(store, now=later) == 0
        row = Job.objects.get(id="18a1-1")
        assert (row.status, row.attempts, row.locked_until) == ("running", 1, later + 60)
        # If that claim's holder really is gone, its new lease runs out and the job comes back.
        assert recover(store, now=later + 61) == 1
        row = Job.objects.get(id="18a1-1")
        assert (row.status, row.attempts) == ("pending", 2) and "worker lost" in row.last_error
    finally:
        store.conn.close()
