"""The claim's statements must be index ranges, so neither due rows nor future rows slow it."""

import time

import pytest
from django.db import connection

from django_rws_jobs.store import band_select, top_band_select, top_priority_select

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FUTURE_ROWS = 100_000


def analyze():
    with connection.cursor() as c:
        if connection.vendor == "mysql":
            c.execute("ANALYZE TABLE rws_jobs")
            c.fetchall()
        else:
            c.execute("ANALYZE rws_jobs" if connection.vendor == "postgresql" else "ANALYZE")


def fill(future: int, due: int) -> int:
    now = int(time.time())
    rows = [(f"f{i:07d}", "t", now + 3600 + i % 5000, now, i % 3) for i in range(future)]
    rows += [(f"d{i:07d}", "t", now - 10 + i % 7, now, 0) for i in range(due)]
    with connection.cursor() as c:
        for start in range(0, len(rows), 5000):
            c.executemany(
                "INSERT INTO rws_jobs (id, job_type, next_run_at, created_at, priority) VALUES (%s, %s, %s, %s, %s)",
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


def assert_index_range(text: str) -> None:
    assert "rws_jobs_claim_idx" in text, text
    assert "Seq Scan" not in text and "SCAN rws_jobs\n" not in text + "\n", text  # no full scan
    assert "Sort" not in text and "TEMP B-TREE" not in text and "filesort" not in text, text  # no sort


def test_claim_statements_are_index_ranges_with_many_due_and_future_rows():
    now = fill(FUTURE_ROWS, 5000)
    for due in (5000, 0):
        if due == 0:
            with connection.cursor() as c:
                c.execute("DELETE FROM rws_jobs WHERE id LIKE 'd%%'")
            analyze()
        for queues in (None, ["default", "mailers"]):
            for priority in (0, 2):
                assert_index_range(plan(*band_select("id", queues, priority, now, 16)))
            for below in (None, 2):
                assert_index_range(plan(*top_band_select("id", queues, below, now, 16)))
        text = plan(*top_priority_select(None, None))
        assert "rws_jobs_claim_idx" in text or "Select tables optimized away" in text or "optimized away" in text, text
        assert "Seq Scan" not in text and "SCAN rws_jobs\n" not in text + "\n", text
        text = plan(*top_priority_select(None, 2))
        assert "Seq Scan" not in text and "SCAN rws_jobs\n" not in text + "\n", text
