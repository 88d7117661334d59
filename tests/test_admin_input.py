"""The admin with ids other writers choose, bad input, and retry-all's cost (issue 16, items 16-17)."""

from __future__ import annotations

import html
import re
import time
from contextlib import nullcontext

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.db import connection
from django.test.utils import CaptureQueriesContext

import django_rws_jobs as rws
from django_rws_jobs.api import dead_letters
from django_rws_jobs.api import enqueue as api
from django_rws_jobs.models import Job, JobSchedule
from tests.test_admin import DEAD, JOBS, OVERVIEW, SCHEDULES, make_job, messages_of, now

pytestmark = pytest.mark.django_db

#: Ids a writer other than enqueue() may choose: the admin quotes _ : / % in URLs as _XX.
ODD_IDS = ["a_b", "a:b", "a/b", "a%b", "a b", "ünï ☃", "job_1A", "x_5Fy", "_", "a?b#c"]


def hrefs(page: str) -> list[str]:
    return [html.unescape(h) for h in re.findall(r'(?:href|action)="([^"]+)"', page)]


def link_to(page: str, *parts: str) -> str:
    found = [h for h in hrefs(page) if all(p in h for p in parts)]
    assert found, f"no link with {parts} on the page"
    return found[0]


@pytest.mark.parametrize("job_id", ODD_IDS)
def test_every_page_of_a_dead_job_with_an_odd_id_works(admin_client, job_id):
    make_job(job_id, status="failed", payload="odd")
    # From the dead-letter list to the job's page, as a browser follows the links.
    detail = link_to(admin_client.get(DEAD).content.decode(), "/change/")
    page = admin_client.get(detail)
    assert page.status_code == 200 and page.context["original"].pk == job_id
    for suffix in ("delete/", "history/"):
        assert admin_client.get(detail.replace("change/", suffix)).status_code == 200, suffix
    # The jobs list's page of the same job links back to it on the dead-letter list.
    job_page = link_to(admin_client.get(JOBS).content.decode(), "/job/", "/change/")
    content = admin_client.get(job_page).content.decode()
    assert link_to(content, "/failedjob/", "/change/") == detail

    response = admin_client.post(link_to(page.content.decode(), "/retry/"))
    assert messages_of(response) == ["Retried 1 dead job; it is due now."]
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempts) == ("pending", 0)
    assert LogEntry.objects.get(action_flag=CHANGE).object_id == job_id


@pytest.mark.parametrize("job_id", ODD_IDS)
def test_a_dead_job_with_an_odd_id_is_deleted_from_its_page(admin_client, job_id):
    make_job(job_id, status="failed")
    detail = link_to(admin_client.get(DEAD).content.decode(), "/change/")
    response = admin_client.post(detail.replace("change/", "delete/"), {"post": "yes"})
    assert response.status_code == 302
    assert not Job.objects.filter(pk=job_id).exists()


@pytest.mark.parametrize("name", ["nightly_1A", "a:b/c", "50% off", "ünï ☃"])
def test_a_schedule_row_with_an_odd_name_opens_and_deletes(admin_client, name):
    JobSchedule.objects.create(name=name, next_run_at=now() + 60, cron="0 * * * * *")  # declared nowhere
    detail = link_to(admin_client.get(SCHEDULES).content.decode(), "/jobschedule/", "/change/")
    page = admin_client.get(detail)
    assert page.status_code == 200 and page.context["original"].pk == name
    response = admin_client.post(detail.replace("change/", "delete/"), {"post": "yes"})
    assert response.status_code == 302 and not JobSchedule.objects.filter(pk=name).exists()


@pytest.mark.parametrize("seen", ["²", "٣", "-5", "9" * 30, str(2**63), "1e5", " 5", "0x10", "5 "])
@pytest.mark.parametrize("action", ["retry_selected", "delete_selected"])
def test_a_bad_seen_until_is_a_400(admin_client, seen, action):
    make_job("d1", status="failed")
    response = admin_client.post(
        DEAD,
        {
            "action": action,
            "index": "0",
            "select_across": "1",
            "_selected_action": ["d1"],
            "rws_seen_until": seen,
            "post": "yes",
        },
    )
    assert response.status_code == 400
    assert Job.objects.get(pk="d1").status == "failed"


def test_the_largest_seen_until_is_accepted(admin_client):
    make_job("d1", status="failed")
    response = admin_client.post(
        DEAD,
        {
            "action": "retry_selected",
            "index": "0",
            "select_across": "1",
            "_selected_action": ["d1"],
            "rws_seen_until": str(2**63 - 1),
        },
    )
    assert messages_of(response) == ["Retried 1 dead job; it is due now."]


NUL_REQUESTS = [
    ("get", JOBS, {"queue": "\x00"}),
    ("get", JOBS, {"job_type": "a\x00"}),
    ("get", JOBS, {"status__exact": "\x00"}),
    ("get", JOBS, {"id": "\x00"}),
    ("get", JOBS, {"q": "\x00"}),
    ("get", DEAD, {"queue": "\x00"}),
    ("get", SCHEDULES, {"name": "\x00"}),
    ("get", "/admin/django_rws_jobs/job/%00/change/", {}),
    ("get", "/admin/django_rws_jobs/job/%00/history/", {}),
    ("get", "/admin/django_rws_jobs/failedjob/%00/change/", {}),
    ("get", "/admin/django_rws_jobs/failedjob/%00/delete/", {}),
    ("get", "/admin/django_rws_jobs/jobschedule/%00/change/", {}),
    ("post", "/admin/django_rws_jobs/failedjob/%00/retry/", {}),
    ("post", DEAD, {"action": "retry_selected", "index": "0", "_selected_action": ["\x00"]}),
    ("post", DEAD, {"action": "delete_selected", "post": "yes", "_selected_action": ["d1", "\x00"]}),
]


@pytest.mark.parametrize(("method", "url", "data"), NUL_REQUESTS)
def test_a_nul_anywhere_is_a_400_on_every_database(admin_client, method, url, data):
    make_job("d1", status="failed")
    response = getattr(admin_client, method)(url, data)
    assert response.status_code == 400
    assert Job.objects.get(pk="d1").status == "failed"


ODD_VALUES = [
    "",
    " ",
    "-1",
    "9" * 40,
    "²",
    "١",
    "1e999",
    "nan",
    "\ud800".encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
    "'; DROP TABLE rws_jobs; --",
    "%",
    "_",
    "a" * 5000,
    "☃",
    "0" * 30 + "1",
]
PARAMS = [
    "q",
    "o",
    "p",
    "e",
    "queue",
    "job_type",
    "status__exact",
    "due",
    "id",
    "name",
    "all",
    "_to_field",
    "next_run_at__gte",
    "created_at__lt",
]


@pytest.mark.slow  # a thousand requests
def test_no_odd_parameter_is_a_500(admin_client):
    make_job("d1", status="failed")
    make_job("p1")
    admin_client.raise_request_exception = False
    failures = []
    for url in (JOBS, DEAD, SCHEDULES, OVERVIEW):
        for param in PARAMS:
            for value in ODD_VALUES:
                status = admin_client.get(url, {param: value}).status_code
                if status >= 500:
                    failures.append((url, param, value[:20], status))
    for value in ODD_VALUES:
        for data in (
            {"action": "retry_selected", "index": value, "_selected_action": ["d1"]},
            {"action": value, "index": "0", "_selected_action": ["d1", value]},
            {"action": "delete_selected", "index": "0", "_selected_action": [value]},
            {"action": "delete_selected", "post": "yes", "select_across": value, "_selected_action": ["x"]},
        ):
            status = admin_client.post(DEAD, data).status_code
            if status >= 500:
                failures.append(("POST", data, status))
    assert failures == []


# ---- retry_many -----------------------------------------------------------------------------


def test_retry_many_keeps_retry_semantics():
    t = now()
    make_job("plain", status="failed", attempts=4, locked_by="w", locked_until=t)
    make_job("keyed", status="failed", unique_key="k1")
    make_job("held", status="failed", unique_key="k2")
    holder = rws.enqueue("test.record", "x", unique="k2")
    make_job("twin1", status="failed", unique_key="k3")
    make_job("twin2", status="failed", unique_key="k3")  # one of the twins only: the other would run twice
    # A seed writer leaves the key's hash on a failed row: the row holds its own key.
    make_job("seeded", status="failed", unique_key="k4", unique_hash=api.unique_hash("test.record", "k4"))
    make_job("alive")
    retried, blocked = dead_letters.retry_many(
        ["plain", "keyed", "held", "twin1", "twin2", "seeded", "alive", "nope"], now=t + 7
    )
    assert sorted(retried) == ["keyed", "plain", "seeded", "twin1"]
    assert sorted(blocked) == ["held", "twin2"]
    for job in Job.objects.filter(pk__in=retried):
        assert (
            job.status,
            job.attempts,
            job.next_run_at,
            job.failed_at,
            job.locked_by,
            job.locked_until,
        ) == ("pending", 0, t + 7, None, None, None)
        expected = api.unique_hash(job.job_type, job.unique_key) if job.unique_key else None
        assert job.unique_hash == expected
    assert Job.objects.get(pk="held").status == "failed" and Job.objects.get(pk="twin2").status == "failed"
    assert Job.objects.get(pk=holder).status == "pending"
    assert rws.enqueue("test.record", "again", unique="k1") == "keyed"  # the key is held again


def test_retry_many_refuses_a_bare_string():
    with pytest.raises(TypeError, match="iterable of ids"):
        dead_letters.retry_many("abc")


def _retry_all_queries(admin_client, n: int) -> int:
    Job.objects.all().delete()
    LogEntry.objects.all().delete()
    t = now()
    Job.objects.bulk_create(
        Job(
            id=f"d{i:04d}",
            job_type="test.record",
            status="failed",
            next_run_at=t,
            created_at=t,
            failed_at=t,
            unique_key=f"k{i}" if i % 3 == 0 else None,
        )
        for i in range(n)
    )
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.post(
            DEAD,
            {"action": "retry_selected", "index": "0", "select_across": "1", "_selected_action": ["d0000"]},
        )
    assert messages_of(response)[-1] == f"Retried {n} dead jobs; they are due now."
    assert Job.objects.filter(status="pending").count() == n
    return len(ctx.captured_queries)


def test_retry_all_takes_a_bounded_number_of_queries(admin_client):
    """Retrying N dead jobs costs a few statements per batch of ids, not several per job: 2,000
    jobs took 9,000+ queries and 13 s on PostgreSQL."""
    batch = dead_letters._retry_batch_size(connection)
    few = _retry_all_queries(admin_client, 5)
    assert _retry_all_queries(admin_client, batch) <= few + 2  # the log entries' own batches
    assert _retry_all_queries(admin_client, 3 * batch) <= 3 * few


# ---- the pages' cost on a big table (the figures: scripts/bench admin) ------------------------


@pytest.mark.parametrize(
    "query",
    ["", "status__exact=pending", "due=now", "due=lease_expired", "queue=mail", "job_type=test.record"],
)
def test_the_jobs_list_reads_no_more_rows_than_it_shows(admin_client, query):
    """No SELECT DISTINCT for the filters, a count that stops at the cap, and the due index's
    order: each read a page's worth of a million-row table, not all of it."""
    make_job("p1")
    with CaptureQueriesContext(connection) as ctx:
        assert admin_client.get(f"{JOBS}?{query}").status_code == 200
    jobs_sql = [q["sql"] for q in ctx.captured_queries if "rws_jobs" in q["sql"]]
    assert not [sql for sql in jobs_sql if "DISTINCT" in sql.upper()]
    counts = [sql for sql in jobs_sql if "COUNT(" in sql.upper()]
    assert len(counts) == 1 and "LIMIT 10001" in counts[0].upper()
    page = [sql for sql in jobs_sql if "COUNT(" not in sql.upper()]
    assert len(page) == 1
    order = re.sub(r'["`]', "", page[0].split("ORDER BY")[1]).split("LIMIT")[0].split(",")
    order = [term.strip().removeprefix("rws_jobs.") for term in order]
    assert order == ["status ASC", "next_run_at ASC", "priority ASC", "id ASC"]
    due_index = next(ix for ix in Job._meta.indexes if ix.name == "rws_jobs_due_idx")
    assert due_index.fields == ["status", "next_run_at", "priority"]


def test_the_jobs_list_says_more_than_the_cap(admin_client, monkeypatch):
    from django_rws_jobs.admin.paginators import CappedCountPaginator

    monkeypatch.setattr(CappedCountPaginator, "cap", 3)
    for i in range(5):
        make_job(f"p{i}")
    response = admin_client.get(JOBS)
    assert len(response.context["cl"].result_list) == 5
    assert "more than 3 jobs" in response.content.decode()
    response = admin_client.get(f"{JOBS}?status__exact=failed")
    assert "0 jobs" in response.content.decode() and "more than" not in response.content.decode()


def test_the_dead_letter_filters_read_no_table(admin_client):
    make_job("d1", status="failed", queue="mailers", job_type="test.mailer")
    with CaptureQueriesContext(connection) as ctx:
        page = admin_client.get(DEAD).content.decode()
    assert "?queue=mailers" in page and "?job_type=test.mailer" in page
    assert not [q for q in ctx.captured_queries if "DISTINCT" in q["sql"].upper()]


def test_the_overview_reads_no_whole_range(admin_client, monkeypatch):
    """The overview counts per queue and state up to a cap (LIMIT), finds the queues and
    priorities by index probes (LIMIT 1), and reads only the running rows whole, for their
    leases: no statement reads every row's entry, as one GROUP BY over the table did."""
    from django_rws_jobs.admin import overview

    monkeypatch.setattr(overview, "COUNT_CAP", 3)
    t = now()
    make_job("p1", queue="mail", due=t - 5)
    make_job("p2", queue="mail", due=t - 50, priority=1)
    make_job("p3", queue="mail", due=t + 600)
    make_job("r1", status="running", locked_until=t - 5)
    make_job("f1", status="failed", queue="mail")
    for i in range(4):
        make_job(f"f{i + 2}", status="failed", queue="bulk")
        make_job(f"b{i}", queue="bulk", due=t - 5, priority=i % 2)  # 2 + 2 due: 4 past the cap
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(OVERVIEW)
    rows = {r["stats"].queue: r for r in response.context["rows"]}
    mail, default, bulk = rows["mail"]["stats"], rows["default"]["stats"], rows["bulk"]["stats"]
    assert (mail.pending, mail.due, mail.oldest_due, mail.failed) == (3, 2, t - 50, 1)
    assert (default.running, default.lease_expired) == (1, 1)
    assert rows["bulk"]["shown"]["failed"] == "3+" and response.context["totals"]["failed"] == "5+"
    assert (bulk.pending, bulk.due, rows["bulk"]["shown"]["due"]) == (4, 4, "3+")
    assert '<a href="/admin/django_rws_jobs/failedjob/?queue=bulk">3+</a>' in response.content.decode()
    jobs_sql = [re.sub(r'["`]', "", q["sql"]).upper() for q in ctx.captured_queries if "rws_jobs" in q["sql"]]
    leases = [sql for sql in jobs_sql if "LOCKED_UNTIL" in sql]
    assert len(leases) == 1 and "STATUS = " in leases[0]
    assert all(
        "LIMIT" in sql and "STATUS = " in sql and "GROUP BY" not in sql
        for sql in jobs_sql
        if sql not in leases
    )


def test_the_dead_letter_list_walks_the_due_index(admin_client):
    """The dead-letter list's order is the due index's, backwards, within status = 'failed': a
    page of 100,000 dead jobs reads a page's worth instead of sorting them all by failed_at."""
    make_job("d1", status="failed")
    with CaptureQueriesContext(connection) as ctx:
        assert admin_client.get(f"{DEAD}?job_type=test.record").status_code == 200
    page = [
        re.sub(r'["`]', "", q["sql"])
        for q in ctx.captured_queries
        if "rws_jobs" in q["sql"] and "COUNT(" not in q["sql"].upper()
    ]
    assert len(page) == 1
    order = page[0].split("ORDER BY")[1].split("LIMIT")[0].split(",")
    order = [term.strip().removeprefix("rws_jobs.") for term in order]
    assert order == ["next_run_at DESC", "priority DESC", "id DESC"]
    due_index = next(ix for ix in Job._meta.indexes if ix.name == "rws_jobs_due_idx")
    assert due_index.fields == ["status", "next_run_at", "priority"]


@pytest.mark.parametrize("action", ["retry_selected", "delete_selected"])
def test_a_big_action_logs_one_entry(admin_client, action):
    """Up to LOG_EACH jobs get an admin log entry each (their history shows it); a bigger
    selection one entry naming the count, not one INSERT and one object per job."""
    from django_rws_jobs.admin.dead import LOG_EACH

    t = now()
    Job.objects.bulk_create(
        Job(
            id=f"d{i:04d}",
            job_type="test.record",
            status="failed",
            next_run_at=t,
            created_at=t,
            failed_at=t - 5,
        )
        for i in range(LOG_EACH + 1)
    )
    extra = {"post": "yes", "rws_seen_until": str(t)} if action == "delete_selected" else {}
    admin_client.post(
        DEAD, {"action": action, "index": "0", "select_across": "1", "_selected_action": ["d0000"], **extra}
    )
    assert not Job.objects.filter(status="failed").exists()
    entry = LogEntry.objects.get()
    verb = "Retried" if action == "retry_selected" else "Deleted"
    assert entry.action_flag == (CHANGE if action == "retry_selected" else DELETION)
    assert entry.object_id is None and entry.object_repr == f"{LOG_EACH + 1} dead jobs"
    assert entry.change_message == f"{verb} {LOG_EACH + 1} dead jobs from the dead-letter list"


def _sleep_sql(seconds: float) -> str:
    """SQL true for every row that sleeps ``seconds`` on each: a count that reads many rows is
    slow for real, one that stops after a few is not."""
    if connection.vendor == "sqlite":
        connection.ensure_connection()
        connection.connection.create_function("rws_test_sleep", 1, lambda s: time.sleep(s) or 0)
        return f"rws_test_sleep({seconds}) = 0"
    return {"postgresql": f"pg_sleep({seconds}) IS NOT NULL", "mysql": f"SLEEP({seconds}) = 0"}[
        connection.vendor
    ]


@pytest.mark.parametrize("in_transaction", [False, True])
def test_a_count_stops_at_its_time_limit(in_transaction):
    from django.db import transaction

    from django_rws_jobs.database.backends import backend_for

    for i in range(200):
        make_job(f"d{i:03d}", status="failed")
    slow = Job.objects.filter(status="failed").extra(where=[_sleep_sql(0.003)])  # 0.6 s in all
    backend = backend_for(connection)
    with transaction.atomic() if in_transaction else nullcontext():
        started = time.monotonic()
        assert backend.count_within(slow, 0.1) is None
        assert time.monotonic() - started < 0.4
        assert backend.count_within(slow[:3], 1.0) == 3
        # The limit ends with the count: a statement after it runs as long as it takes.
        assert slow[:60].count() == 60
        assert Job.objects.filter(status="failed").count() == 200  # the transaction still works


def test_a_slow_count_gives_way_to_a_capped_one(admin_client, monkeypatch):
    """A dead-letter list whose exact count takes longer than its time limit counts up to a cap
    and says "more than"; "Select all" still selects every dead job on the list."""
    from django_rws_jobs.admin.dead import FailedJobAdmin
    from django_rws_jobs.admin.paginators import TimedCountPaginator

    for i in range(600):
        make_job(f"d{i:03d}", status="failed")
    slow_each_row = _sleep_sql(0.001)  # an exact count: 0.6 s; a count capped at 60: 61 ms
    listed = FailedJobAdmin.get_queryset
    slow_list = lambda self, request: listed(self, request).extra(where=[slow_each_row])  # noqa: E731
    monkeypatch.setattr(FailedJobAdmin, "get_queryset", slow_list)
    monkeypatch.setattr(TimedCountPaginator, "seconds", 0.25)
    monkeypatch.setattr(TimedCountPaginator, "cap", 60)
    response = admin_client.get(DEAD)
    page = response.content.decode()
    assert len(response.context["cl"].result_list) == 50
    assert "more than 60 jobs" in page and "Select all (more than 60) dead jobs" in page
    assert "Select all 600" not in page and "600 jobs" not in page

    monkeypatch.setattr(TimedCountPaginator, "seconds", 5.0)  # fast enough again: the exact count
    page = admin_client.get(DEAD).content.decode()
    assert "more than" not in page and "Select all 600 dead jobs" in page

    response = admin_client.post(
        DEAD, {"action": "retry_selected", "index": "0", "select_across": "1", "_selected_action": ["d000"]}
    )
    assert messages_of(response) == ["Retried 600 dead jobs; they are due now."]


@pytest.mark.parametrize("action", ["retry_selected", "delete_selected"])
def test_an_action_that_fails_half_way_logs_what_it_did(admin_client, action):
    """Each batch of an action commits on its own: when a later one fails, the jobs the batches
    before it retried or deleted are in the admin log, and the failure is raised."""
    if connection.vendor != "sqlite":
        pytest.skip("the failure comes from a SQLite trigger")
    from django.db import OperationalError

    from django_rws_jobs.admin.dead_reports import BATCH

    first = dead_letters.RETRY_BATCH if action == "retry_selected" else BATCH
    Job.objects.bulk_create(
        Job(id=f"d{i:05d}", job_type="test.record", status="failed", next_run_at=0, created_at=0, failed_at=0)
        for i in range(first + 1)
    )
    # The first batch's statement passes, the next one fails (whichever rows each batch holds).
    if action == "retry_selected":
        when = f"UPDATE ON rws_jobs WHEN (SELECT COUNT(*) FROM rws_jobs WHERE status = 'pending') >= {first}"
    else:
        when = "DELETE ON rws_jobs WHEN (SELECT COUNT(*) FROM rws_jobs) <= 1"
    with connection.cursor() as c:
        c.execute(f"CREATE TRIGGER rws_test_fail BEFORE {when} BEGIN SELECT abs(-9223372036854775808); END")
    form = {"action": action, "index": "0", "select_across": "1", "_selected_action": ["d00000"]}
    if action == "delete_selected":
        form.update({"post": "yes", "rws_seen_until": str(now())})
    try:
        with pytest.raises(OperationalError, match="integer overflow"):
            admin_client.post(DEAD, form)
    finally:
        with connection.cursor() as c:
            c.execute("DROP TRIGGER rws_test_fail")
    print(
        "DEBUG",
        Job.objects.count(),
        list(Job.objects.values_list("status").distinct()),
        list(LogEntry.objects.values_list("change_message")),
    )
    verb = "Retried" if action == "retry_selected" else "Deleted"
    (entry,) = LogEntry.objects.all()
    assert entry.change_message == f"{verb} {first} dead jobs from the dead-letter list"
    assert Job.objects.filter(status="failed").count() == 1
