"""The claim query must use the due index, so rows that are not due cost nothing."""

import time

import pytest
from django.db import connection

from django_rws_jobs.store import due_select

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FUTURE_ROWS = 100_000


def fill(future: int, due: int) -> int:
    now = int(time.time())
    rows = [(f"f{i:07d}", "t", now + 3600 + i % 5000, now) for i in range(future)]
    rows += [(f"d{i:07d}", "t", now - 10, now) for i in range(due)]
    with connection.cursor() as c:
        for start in range(0, len(rows), 5000):
            c.executemany(
                "INSERT INTO rws_jobs (id, job_type, next_run_at, created_at) VALUES (%s, %s, %s, %s)",
                rows[start:start + 5000],
            )
    analyze()
    return now


def plan(sql: str, params: list) -> str:
    with connection.cursor() as c:
        if connection.vendor == "postgresql":
            c.execute("EXPLAIN " + sql, params)
            return "\n".join(r[0] for r in c.fetchall())
        if connection.vendor == "mysql":
            c.execute("EXPLAIN FORMAT=JSON " + sql, params)
            return c.fetchone()[0]
        c.execute("EXPLAIN QUERY PLAN " + sql, params)
        return "\n".join(str(r[-1]) for r in c.fetchall())


def analyze():
    with connection.cursor() as c:
        if connection.vendor == "mysql":
            c.execute("ANALYZE TABLE rws_jobs")
            c.fetchall()
        else:
            c.execute("ANALYZE rws_jobs" if connection.vendor == "postgresql" else "ANALYZE")


def test_claim_uses_the_due_index_with_many_future_rows():
    now = fill(FUTURE_ROWS, 20)
    for due in (20, 0):
        if due == 0:
            with connection.cursor() as c:
                c.execute("DELETE FROM rws_jobs WHERE id LIKE 'd%%'")
            analyze()
        for queues in (None, ["default", "mailers"]):
            text = plan(*due_select("id", queues, now, 16))
            assert "rws_jobs_due_idx" in text, (due, queues, text)
            assert "Seq Scan" not in text and "SCAN rws_jobs\n" not in text + "\n", (due, queues, text)
