"""The admin, through Django's test client: pages, filters, search, actions, permissions, escaping."""

from __future__ import annotations

import re
import time

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

import django_rws_jobs as rws
from django_rws_jobs.models import Job, JobSchedule
from django_rws_jobs.operations.humanize import absolute, describe_cron, duration, relative

pytestmark = pytest.mark.django_db

XSS = "<script>alert(1)</script>"
XSS_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"

JOBS = reverse("admin:django_rws_jobs_job_changelist")
DEAD = reverse("admin:django_rws_jobs_failedjob_changelist")
SCHEDULES = reverse("admin:django_rws_jobs_jobschedule_changelist")
OVERVIEW = reverse("admin:django_rws_jobs_job_overview")


def now() -> int:
    return int(time.time())


def make_job(
    job_id: str,
    *,
    status: str = "pending",
    job_type: str = "test.record",
    payload: str = "p",
    queue: str = "default",
    due: int | None = None,
    created: int | None = None,
    failed_at: int | None = None,
    unique_key: str | None = None,
    error: str | None = None,
    locked_until: int | None = None,
    **extra: object,
) -> Job:
    t = now()
    if status == "failed":
        error = error if error is not None else f"ValueError: boom {job_id}"
        extra.setdefault("traceback", f"Traceback (most recent call last):\n  ...\nValueError: boom {job_id}")
        extra.setdefault("attempts", 4)
        failed_at = t - 60 if failed_at is None else failed_at
    return Job.objects.create(
        id=job_id,
        job_type=job_type,
        payload=payload,
        status=status,
        queue=queue,
        next_run_at=t if due is None else due,
        created_at=t - 10 if created is None else created,
        failed_at=failed_at,
        unique_key=unique_key,
        last_error=error,
        locked_until=locked_until,
        **extra,
    )


def messages_of(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def result_ids(response) -> list[str]:
    return [obj.pk for obj in response.context["cl"].result_list]


def staff(django_user_model, username: str, *codenames: str) -> Client:
    user = django_user_model.objects.create_user(username, password="pw", is_staff=True)
    perms = Permission.objects.filter(content_type__app_label="django_rws_jobs", codename__in=codenames)
    assert perms.count() == len(codenames), f"missing permissions among {codenames}"
    user.user_permissions.set(perms)
    client = Client()
    client.force_login(user)
    return client


VIEW_ALL = ("view_job", "view_failedjob", "view_jobschedule")


@pytest.fixture
def viewer(django_user_model) -> Client:
    return staff(django_user_model, "viewer", *VIEW_ALL)


@pytest.fixture
def nobody(django_user_model) -> Client:
    return staff(django_user_model, "nobody")


def retry_post(client: Client, *ids: str, **extra: str):
    data = {"action": "retry_selected", "index": "0", "_selected_action": list(ids), **extra}
    return client.post(DEAD, data)


def delete_post(client: Client, *ids: str, confirm: bool = False, **extra: str):
    data = {"action": "delete_selected", "_selected_action": list(ids), **extra}
    if confirm:
        data["post"] = "yes"
    else:
        data["index"] = "0"
    return client.post(DEAD, data)


# ---- words -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (0, "0 s"),
        (45, "45 s"),
        (90, "2 min"),
        (179, "3 min"),
        (3599, "1 h"),
        (5400, "1 h 30 min"),
        (7199, "2 h"),
        (13 * 3600 + 100, "13 h"),
        (86399, "1 d"),
        (90000, "1 d 1 h"),
        (40 * 86400, "40 d"),
        (3 * 366 * 86400, "3 y"),
    ],
)
def test_duration_rounds_to_what_a_reader_needs(seconds, words):
    assert duration(seconds) == words


def test_relative_and_absolute_times():
    assert relative(1000 + 180, 1000) == "in 3 min"
    assert relative(1000 - 7200, 1000) == "2 h ago"
    assert relative(1000, 1000) == "now"
    assert relative(None, 1000) == "-"
    assert absolute(86400 + 3 * 3600) == "1970-01-02 03:00:00 UTC"
    assert absolute(2**62) == f"{2**62} (unix seconds)"  # no calendar holds it; the page still renders


@pytest.mark.parametrize(
    ("expr", "words"),
    [
        ("*/15 * * * * *", "every 15 seconds"),
        ("* * * * * *", "every second"),
        ("0 * * * * *", "every minute"),
        ("0 */5 * * * *", "every 5 minutes"),
        ("0 0 * * * *", "every hour, on the hour"),
        ("0 30 * * * *", "every hour at minute 30"),
        ("0 0,30 * * * *", "every hour at minutes 0 and 30"),
        ("0 0 */6 * * *", "every 6 hours"),
        ("0 0 3 * * *", "at 03:00:00 UTC every day"),
        ("0 0 9,17 * * *", "at 09:00:00 and 17:00:00 UTC every day"),
        ("0 0 3 * * 1-5", "at 03:00:00 UTC on Monday to Friday"),
        ("0 0 3 * * mon,fri", "at 03:00:00 UTC on Monday and Friday"),
        ("0 0 3 1 * *", "at 03:00:00 UTC on day 1 of every month"),
        ("0 0 3 1 1 *", "at 03:00:00 UTC on 1 January"),
        ("0 0 0 13 * 5", "at 00:00:00 UTC on day 13 of every month, if it is a Friday"),
        ("0 */15 9-17 * * 1-5", "every 15 minutes, from 09:00 to 17:59 UTC, on Monday to Friday"),
        ("*/5 * * * *", "every 5 minutes"),  # five fields: classic cron, second 0
        ("@daily", "at 00:00:00 UTC every day"),
        ("@hourly", "every hour, on the hour"),
        ("@Weekly", "at 00:00:00 UTC on Sunday"),
        # No short wording: shown as written.
        ("1-10/2 * * * * *", "1-10/2 * * * * *"),
        ("0 0 1,2,3,4,5 * * *", "0 0 1,2,3,4,5 * * *"),
        ("not cron", "not cron"),
    ],
)
def test_describe_cron(expr, words):
    assert describe_cron(expr) == words


# ---- jobs ---------------------------------------------------------------------------------


def test_anonymous_and_non_staff_users_are_sent_to_the_login_page(client, django_user_model):
    for url in (JOBS, DEAD, SCHEDULES, OVERVIEW):
        response = client.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"]
    user = django_user_model.objects.create_user("customer", password="pw")
    client.force_login(user)
    assert client.get(DEAD).status_code == 302


def test_staff_without_permissions_gets_403_everywhere(nobody):
    make_job("d1", status="failed")
    for url in (JOBS, DEAD, SCHEDULES, OVERVIEW, reverse("admin:django_rws_jobs_job_change", args=["d1"])):
        assert nobody.get(url).status_code == 403, url
    assert retry_post(nobody, "d1").status_code == 403
    assert Job.objects.get(id="d1").status == "failed"


def test_jobs_list_filters_and_search(admin_client):
    t = now()
    make_job("p-due", due=t - 30, unique_key="receipt:1")
    make_job("p-later", due=t + 600, queue="mailers", job_type="test.mailer")
    make_job("r-ok", status="running", locked_until=t + 60)
    make_job("r-stuck", status="running", locked_until=t - 5)
    make_job("f-1", status="failed", queue="mailers")

    response = admin_client.get(JOBS)
    assert response.status_code == 200
    assert set(result_ids(response)) == {"p-due", "p-later", "r-ok", "r-stuck", "f-1"}
    cases = {
        "status__exact=failed": {"f-1"},
        "status__exact=running": {"r-ok", "r-stuck"},
        "queue=mailers": {"p-later", "f-1"},
        "job_type=test.mailer": {"p-later"},
        "due=now": {"p-due"},
        "due=later": {"p-later"},
        "due=lease_expired": {"r-stuck"},
        "q=receipt:1": {"p-due"},
        "q=r-stuck": {"r-stuck"},
        "q=test.mailer": {"p-later"},
        "queue=mailers&status__exact=pending": {"p-later"},
    }
    for query, expected in cases.items():
        response = admin_client.get(f"{JOBS}?{query}")
        assert response.status_code == 200, query
        assert set(result_ids(response)) == expected, query
    # The filter sidebar offers the queues and job types that the code declares (not a scan of
    # the table), and a value chosen elsewhere while it is chosen.
    page = admin_client.get(JOBS).content.decode()
    assert "?queue=mailers" in page and "?job_type=test.mailer" in page
    assert "?queue=elsewhere" in admin_client.get(f"{JOBS}?queue=elsewhere").content.decode()


def test_jobs_list_shows_readable_times_and_the_error(admin_client):
    t = now()
    make_job("soon", due=t + 180, created=t - 7200)
    make_job("dead", status="failed", error="ConnectionError: gateway down\nsecond line")
    page = admin_client.get(JOBS).content.decode()
    assert "in 3 min" in page and "2 h ago" in page
    assert absolute(t + 180) in page  # the exact time on hover
    assert "ConnectionError: gateway down" in page


def test_jobs_list_columns_sort(admin_client):
    t = now()
    make_job("a", due=t + 300, created=t - 1)
    make_job("b", due=t + 100, created=t - 3)
    make_job("c", due=t + 200, created=t - 2)
    make_job("f", due=t + 400, status="failed")
    make_job("r", due=t, status="running")
    cl = admin_client.get(JOBS).context["cl"]
    # By default failed, then pending by due time, then running (the due index's order).
    assert result_ids(admin_client.get(JOBS)) == ["f", "b", "c", "a", "r"]
    created = list(cl.list_display).index("created")
    assert result_ids(admin_client.get(f"{JOBS}?o=-{created}"))[:3] == ["a", "c", "b"]
    due = list(cl.list_display).index("due")
    assert result_ids(admin_client.get(f"{JOBS}?o={due}")) == ["r", "b", "c", "a", "f"]
    assert result_ids(admin_client.get(f"{JOBS}?o=-{due}")) == ["f", "a", "c", "b", "r"]


@pytest.mark.django_db(transaction=True)  # tick() closes connections, as around a request
def test_job_detail_is_read_only_with_payload_and_traceback(admin_client):
    rws.enqueue("test.fail", "order 7", max_retries=0)
    assert rws.tick() is True  # a real failure: the worker's code path writes error and traceback
    job = Job.objects.get()
    assert job.status == "failed"
    response = admin_client.get(reverse("admin:django_rws_jobs_job_change", args=[job.pk]))
    page = response.content.decode()
    assert response.status_code == 200
    assert "order 7" in page
    assert "ValueError: boom order 7" in page
    assert "Traceback (most recent call last)" in page and "tests/testapp/jobs.py" in page
    assert 'name="_save"' not in page and 'name="payload"' not in page  # nothing to edit
    # A dead job's page points to the dead-letter list, where it can be retried.
    assert reverse("admin:django_rws_jobs_failedjob_change", args=[job.pk]) in page


def test_jobs_cannot_be_added_changed_or_deleted(admin_client):
    make_job("j1")
    change = reverse("admin:django_rws_jobs_job_change", args=["j1"])
    assert admin_client.get(reverse("admin:django_rws_jobs_job_add")).status_code == 403
    admin_client.post(change, {"payload": "changed", "status": "failed"})
    assert Job.objects.get(id="j1").payload == "p"
    delete = reverse("admin:django_rws_jobs_job_delete", args=["j1"])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert Job.objects.filter(id="j1").exists()
    page = admin_client.get(JOBS).content.decode()
    assert "cancel_selected" in page and "delete_selected" not in page  # one bulk action: cancel


def test_user_supplied_text_is_escaped_everywhere(admin_client):
    make_job(
        "x1",
        status="failed",
        job_type=XSS,
        payload=XSS,
        error=XSS,
        queue="<b>q</b>",
        unique_key=XSS,
        traceback=XSS,
    )
    pages = [
        admin_client.get(JOBS),
        admin_client.get(DEAD),
        admin_client.get(OVERVIEW),
        admin_client.get(reverse("admin:django_rws_jobs_job_change", args=["x1"])),
        admin_client.get(reverse("admin:django_rws_jobs_failedjob_change", args=["x1"])),
        delete_post(admin_client, "x1"),  # the confirmation page lists the job
    ]
    for response in pages:
        page = response.content.decode()
        assert response.status_code == 200, response.request["PATH_INFO"]
        assert XSS not in page and "<b>q</b>" not in page, response.request["PATH_INFO"]
        assert XSS_ESCAPED in page or "&lt;b&gt;q&lt;/b&gt;" in page, response.request["PATH_INFO"]


# ---- dead-letter list ---------------------------------------------------------------------


def test_dead_letter_list_holds_failed_jobs_newest_last_attempt_first(admin_client):
    t = now()
    make_job("old", status="failed", due=t - 3005, failed_at=t - 3000)
    make_job("new", status="failed", due=t - 15, failed_at=t - 10)
    make_job("mid", status="failed", due=t - 605, failed_at=t - 600)
    make_job("seed", status="failed", due=t - 1000, failed_at=None)
    Job.objects.filter(id="seed").update(failed_at=None)  # a row the Rust crate failed: no failed_at
    make_job("alive", status="pending")
    response = admin_client.get(DEAD)
    assert result_ids(response) == ["new", "mid", "seed", "old"]
    page = response.content.decode()
    # The first request of a run can take a second or two on a cold machine: allow the clock to move.
    assert re.search(r"\b1[0-4] s ago", page) and "50 min ago" in page
    assert "Retry selected dead jobs" in page and "Delete selected dead jobs" in page


def test_retry_action_puts_jobs_back_and_says_so(admin_client, django_user_model):
    make_job("d1", status="failed")
    make_job("d2", status="failed")
    make_job("d3", status="failed")
    before = now()
    response = retry_post(admin_client, "d1", "d2")
    assert response.status_code == 302
    assert messages_of(response) == ["Retried 2 dead jobs; they are due now."]
    for job in Job.objects.filter(id__in=["d1", "d2"]):
        assert (job.status, job.attempts, job.failed_at) == ("pending", 0, None)
        assert before <= job.next_run_at <= now()
    assert Job.objects.get(id="d3").status == "failed"
    assert result_ids(admin_client.get(DEAD)) == ["d3"]
    logged = LogEntry.objects.filter(action_flag=CHANGE, object_id__in=["d1", "d2"])
    assert logged.count() == 2 and {e.user.username for e in logged} == {"admin"}


@pytest.mark.django_db(transaction=True)  # tick() closes connections, as around a request
def test_retried_job_runs_again(admin_client, runs):
    make_job("d1", status="failed", job_type="test.record", payload="again")
    retry_post(admin_client, "d1")
    assert rws.tick() is True
    assert runs() == [("record", "again")]


def test_retry_skips_a_job_whose_unique_key_is_taken(admin_client):
    make_job("d1", status="failed", unique_key="receipt:9")
    make_job("d2", status="failed", unique_key="receipt:10")
    holder = rws.enqueue("test.record", "x", unique="receipt:9")
    response = retry_post(admin_client, "d1", "d2")
    assert messages_of(response) == [
        "Retried 1 dead job; it is due now.",
        (
            "Skipped 1 job: a pending or running job of the same type holds its unique key, so retrying it "
            "would run that work twice: d1."
        ),
    ]
    assert Job.objects.get(id="d1").status == "failed"
    assert Job.objects.get(id="d2").status == "pending"
    assert Job.objects.get(id=holder).status == "pending"


def test_retry_reports_jobs_that_left_the_list_meanwhile(admin_client):
    make_job("d1", status="failed")
    make_job("d2", status="failed")
    make_job("d3", status="failed")
    assert rws.retry("d2") is True  # another operator was faster
    Job.objects.filter(id="d3").delete()
    response = retry_post(admin_client, "d1", "d2", "d3")
    assert messages_of(response) == [
        "Retried 1 dead job; it is due now.",
        "Skipped 1 job that left the dead-letter list (it was retried meanwhile and is pending): d2.",
        "Skipped 1 job that left the dead-letter list (it no longer exists): d3.",
    ]


def test_retry_all_across_pages_is_one_action(admin_client):
    for i in range(60):  # more than one page (50)
        make_job(f"m{i:02d}", status="failed", queue="mailers")
    make_job("other", status="failed", queue="default")
    # "Select all 60" covers the filtered list; the filter travels in the URL, as the page sends it.
    response = admin_client.post(
        f"{DEAD}?queue=mailers",
        {"action": "retry_selected", "index": "0", "select_across": "1", "_selected_action": ["m00"]},
    )
    assert messages_of(response) == ["Retried 60 dead jobs; they are due now."]
    assert Job.objects.filter(queue="mailers", status="pending").count() == 60
    assert Job.objects.get(id="other").status == "failed"


def test_delete_action_asks_first_then_deletes(admin_client):
    make_job("d1", status="failed", job_type="shop.charge_card")
    make_job("d2", status="failed")
    make_job("d3", status="failed")
    response = delete_post(admin_client, "d1", "d2")
    page = response.content.decode()
    assert response.status_code == 200
    assert "Are you sure you want to delete 2 dead jobs?" in page
    assert "shop.charge_card" in page and 'name="csrfmiddlewaretoken"' in page
    assert 'name="post" value="yes"' in page and 'value="delete_selected"' in page
    assert Job.objects.filter(status="failed").count() == 3  # nothing deleted yet

    response = delete_post(admin_client, "d1", "d2", confirm=True)
    assert response.status_code == 302
    assert messages_of(response) == ["Deleted 2 dead jobs."]
    assert list(Job.objects.values_list("id", flat=True)) == ["d3"]
    logged = LogEntry.objects.filter(action_flag=DELETION).values_list("object_id", flat=True)
    assert set(logged) == {"d1", "d2"}


def test_delete_keeps_a_job_retried_after_the_confirmation_page(admin_client):
    make_job("d1", status="failed")
    make_job("d2", status="failed")
    assert delete_post(admin_client, "d1", "d2").status_code == 200
    assert rws.retry("d2") is True
    response = delete_post(admin_client, "d1", "d2", confirm=True)
    assert messages_of(response) == [
        "Deleted 1 dead job.",
        "Skipped 1 job that left the dead-letter list (it was retried meanwhile and is pending): d2.",
    ]
    assert list(Job.objects.values_list("id", "status")) == [("d2", "pending")]


def test_delete_all_across_pages_confirms_without_listing_every_id(admin_client):
    t = now()
    for i in range(60):
        make_job(f"d{i:02d}", status="failed", failed_at=t - 100)
    response = admin_client.post(
        DEAD, {"action": "delete_selected", "index": "0", "select_across": "1", "_selected_action": ["d00"]}
    )
    page = response.content.decode()
    assert "Are you sure you want to delete 60 dead jobs?" in page and "and 0 more" not in page
    assert page.count('name="_selected_action"') == 1 and 'name="select_across" value="1"' in page
    seen = int(page.split('name="rws_seen_until" value="')[1].split('"')[0])
    make_job("later", status="failed", failed_at=seen + 5)  # failed after the page was shown
    # failed_at is whole seconds: one of the page's own second may have failed after it was shown
    make_job("same-second", status="failed", failed_at=seen)
    response = admin_client.post(
        DEAD,
        {
            "action": "delete_selected",
            "index": "0",
            "select_across": "1",
            "_selected_action": ["d00"],
            "post": "yes",
            "rws_seen_until": str(seen),
        },
    )
    assert messages_of(response) == ["Deleted 60 dead jobs."]
    assert sorted(Job.objects.values_list("id", flat=True)) == ["later", "same-second"]


def test_detail_page_retry_button(admin_client):
    make_job("d1", status="failed")
    detail = reverse("admin:django_rws_jobs_failedjob_change", args=["d1"])
    retry_url = reverse("admin:django_rws_jobs_failedjob_retry", args=["d1"])
    page = admin_client.get(detail).content.decode()
    assert f'action="{retry_url}"' in page and "Retry now" in page
    assert admin_client.get(retry_url).status_code == 405  # a GET changes nothing
    assert Job.objects.get(id="d1").status == "failed"
    response = admin_client.post(retry_url)
    assert response.status_code == 302 and response["Location"] == DEAD
    assert messages_of(response) == ["Retried 1 dead job; it is due now."]
    assert Job.objects.get(id="d1").status == "pending"
    assert "Retried 1 dead job" in admin_client.get(DEAD).content.decode()  # shown once, then gone
    response = admin_client.post(retry_url)  # again: nothing left to retry, and it says why
    assert messages_of(response) == [
        "Skipped 1 job that left the dead-letter list (it was retried meanwhile and is pending): d1."
    ]


def test_single_dead_job_delete_page(admin_client):
    make_job("d1", status="failed")
    url = reverse("admin:django_rws_jobs_failedjob_delete", args=["d1"])
    assert "Are you sure" in admin_client.get(url).content.decode()
    admin_client.post(url, {"post": "yes"})
    assert not Job.objects.filter(id="d1").exists()


def test_view_only_staff_can_look_but_not_act(viewer):
    make_job("d1", status="failed", payload="look")
    dead_page = reverse("admin:django_rws_jobs_failedjob_change", args=["d1"])
    job_page = reverse("admin:django_rws_jobs_job_change", args=["d1"])
    for url in (JOBS, DEAD, SCHEDULES, OVERVIEW, dead_page, job_page):
        assert viewer.get(url).status_code == 200, url
    assert 'name="action"' not in viewer.get(DEAD).content.decode()
    assert "Retry now" not in viewer.get(dead_page).content.decode()
    assert retry_post(viewer, "d1").status_code == 403
    assert delete_post(viewer, "d1").status_code == 403
    assert delete_post(viewer, "d1", confirm=True).status_code == 403
    assert viewer.post(reverse("admin:django_rws_jobs_failedjob_retry", args=["d1"])).status_code == 403
    delete = reverse("admin:django_rws_jobs_failedjob_delete", args=["d1"])
    assert viewer.post(delete, {"post": "yes"}).status_code == 403
    assert Job.objects.get(id="d1").status == "failed"


def test_retry_permission_does_not_grant_delete(django_user_model):
    operator = staff(django_user_model, "operator", "view_failedjob", "change_failedjob")
    make_job("d1", status="failed")
    make_job("d2", status="failed")
    page = operator.get(DEAD).content.decode()
    assert "Retry selected dead jobs" in page and "Delete selected dead jobs" not in page
    assert delete_post(operator, "d2", confirm=True).status_code == 403
    assert messages_of(retry_post(operator, "d1")) == ["Retried 1 dead job; it is due now."]
    assert Job.objects.get(id="d2").status == "failed"


def test_actions_need_the_csrf_token(django_user_model):
    user = django_user_model.objects.create_superuser("root", password="pw")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    make_job("d1", status="failed")
    assert retry_post(client, "d1").status_code == 403
    assert delete_post(client, "d1", confirm=True).status_code == 403
    assert client.post(reverse("admin:django_rws_jobs_failedjob_retry", args=["d1"])).status_code == 403
    assert Job.objects.get(id="d1").status == "failed"


# ---- overview -----------------------------------------------------------------------------


def test_overview_counts_per_queue(admin_client):
    t = now()
    make_job("a1", due=t - 300)  # due, waiting 5 min
    make_job("a2", due=t - 20)
    make_job("a3", due=t + 600)  # pending, not due
    make_job("a4", status="running", locked_until=t + 60)
    make_job("a5", status="running", locked_until=t - 60)  # its worker is gone
    make_job("a6", status="failed")
    make_job("m1", status="failed", queue="mailers")
    response = admin_client.get(OVERVIEW)
    assert response.status_code == 200
    rows = {r["stats"].queue: r for r in response.context["rows"]}
    d, m = rows["default"]["stats"], rows["mailers"]["stats"]
    assert (d.pending, d.due, d.running, d.lease_expired, d.failed) == (3, 2, 2, 1, 1)
    assert (m.pending, m.due, m.running, m.failed) == (0, 0, 0, 1)
    assert rows["default"]["waited"] == "5 min" and rows["mailers"]["waited"] is None
    page = response.content.decode()
    assert 'class="seg rws-seg-due"' in page and 'class="seg rws-seg-failed"' in page  # the chart
    assert f"{DEAD}?queue=mailers" in page and f"{JOBS}?queue=default&amp;due=now" in page
    totals = response.context["totals"]
    assert (totals["pending"], totals["failed"]) == ("3", "2")
    # Its links lead to lists that hold what the numbers count.
    assert set(result_ids(admin_client.get(f"{JOBS}?queue=default&due=now"))) == {"a1", "a2"}


def test_overview_is_linked_from_the_queue_pages(admin_client):
    for url in (JOBS, DEAD, SCHEDULES):
        assert f'href="{OVERVIEW}"' in admin_client.get(url).content.decode(), url
    page = admin_client.get(OVERVIEW).content.decode()
    assert f'href="{DEAD}"' in page and "No jobs in any queue." in page


PAUSE = reverse("admin:django_rws_jobs_job_overview_pause")


def test_overview_pauses_and_resumes_a_queue(admin_client):
    make_job("a1", due=now() - 5)
    page = admin_client.get(OVERVIEW).content.decode()
    assert f'action="{PAUSE}"' in page and 'value="pause"' in page and "csrfmiddlewaretoken" in page
    response = admin_client.post(PAUSE, {"queue": "default", "action": "pause"})
    assert response.status_code == 302 and response["Location"] == OVERVIEW
    assert rws.paused_queues() == ["default"]
    assert "Paused queue default" in str(list(get_messages(response.wsgi_request))[0])
    rws.pause_queue("idle")  # paused, no job: still listed, so it can be resumed
    rows = {r["stats"].queue: r for r in admin_client.get(OVERVIEW).context["rows"]}
    assert rows["default"]["paused"] and rows["idle"]["paused"]
    page = admin_client.get(OVERVIEW).content.decode()
    assert page.count('value="resume"') == 2 and 'value="pause"' not in page
    admin_client.post(PAUSE, {"queue": "default", "action": "resume"})
    assert rws.paused_queues() == ["idle"]


def test_overview_pause_refuses_bad_input_by_name(admin_client):
    for data, message in (
        ({"queue": "a,b", "action": "pause"}, "contains a comma"),
        ({"queue": "", "action": "pause"}, "must not be empty"),
        ({"queue": "x", "action": "stop"}, "Unknown action 'stop'"),
    ):
        response = admin_client.post(PAUSE, data)
        assert response.status_code == 302
        assert message in str(list(get_messages(response.wsgi_request))[-1])
    assert rws.paused_queues() == []
    assert admin_client.get(PAUSE).status_code == 403  # POST only


def test_overview_pause_needs_its_permission_and_a_csrf_token(client, django_user_model):
    staff = django_user_model.objects.create_user("viewer-pause", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(staff)
    make_job("a1")
    assert 'value="pause"' not in client.get(OVERVIEW).content.decode()
    assert client.post(PAUSE, {"queue": "default", "action": "pause"}).status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="pause_queue"))
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(staff)
    assert 'value="pause"' in strict.get(OVERVIEW).content.decode()
    assert strict.post(PAUSE, {"queue": "default", "action": "pause"}).status_code == 403  # no token
    assert rws.paused_queues() == []
    assert client.post(PAUSE, {"queue": "default", "action": "pause"}).status_code == 302
    assert rws.paused_queues() == ["default"]


def test_a_job_page_says_when_its_paused_queue_holds_it_back(admin_client):
    make_job("due1", due=now() - 5, queue="mail")
    make_job("later1", due=now() + 600, queue="mail")

    def page(pk: str) -> str:
        return admin_client.get(reverse("admin:django_rws_jobs_job_change", args=[pk])).content.decode()

    assert "rws-waits-for" not in page("due1")
    rws.pause_queue("mail")
    assert "its queue mail is paused" in page("due1")
    assert "rws-waits-for" not in page("later1")  # not due: the pause is not why it waits


def test_a_due_jobs_page_says_why_it_waits(admin_client, settings):
    """Its concurrency key at its limit, its queue at its concurrency or rate limit: each named,
    with the numbers; a job that nothing holds back gets no box."""
    settings.RWS_JOBS = {
        **settings.RWS_JOBS,
        "QUEUES": {"api": {"concurrency": 1}, "pay": {"rate_limit": "2/h"}, "free": {"concurrency": 5}},
    }
    t = now()

    def page(pk: str) -> str:
        return admin_client.get(reverse("admin:django_rws_jobs_job_change", args=[pk])).content.decode()

    make_job("holder", status="running", concurrency_key="acct:1", concurrency_limit=1, concurrency_slot=0)
    make_job("keyed", status="waiting", due=t - 5, concurrency_key="acct:1", concurrency_limit=1)
    assert "its concurrency key acct:1 has all 1 of its slots taken (by holder)" in page("keyed")
    assert "acct:1 (limit 1, holds slot 0)" in page("holder")
    make_job("roomy", status="waiting", due=t - 5, concurrency_key="acct:2", concurrency_limit=2)
    assert "acct:2 has 0 of 2 slots taken; a worker makes it pending" in page("roomy")

    make_job("api-run", status="running", queue="api", locked_until=t + 60)
    make_job("api-due", due=t - 5, queue="api")
    assert "its queue api runs 1 jobs, its concurrency limit of 1" in page("api-due")
    make_job("free-due", due=t - 5, queue="free")
    assert "rws-waits-for" not in page("free-due")  # under its limit: the next claim takes it

    from django_rws_jobs.models import Queue, QueueStart

    make_job("pay-due", due=t - 5, queue="pay")
    assert "rws-waits-for" not in page("pay-due")
    Queue.objects.create(name="pay", rate_slots=2, rate_next=0)  # two starts a minute ago
    QueueStart.objects.bulk_create(
        [QueueStart(queue="pay", slot=s, started_us=(t - 60) * 10**6) for s in (0, 1)]
    )
    assert (
        "its queue pay started 2 jobs in the last hour, its rate limit of 2/h. It starts from "
        f"{absolute(t + 3540)}"
    ) in page("pay-due")


def test_overview_shows_limits_and_jobs_waiting_for_their_key(admin_client, settings):
    settings.RWS_JOBS = {**settings.RWS_JOBS, "QUEUES": {"api": {"concurrency": 4, "rate_limit": "100/m"}}}
    make_job("w1", status="waiting", concurrency_key="k")
    make_job("w2", status="waiting", concurrency_key="k", due=now() + 600)
    make_job("p1", concurrency_key="k", concurrency_slot=0)
    response = admin_client.get(OVERVIEW)
    rows = {r["stats"].queue: r for r in response.context["rows"]}
    d = rows["default"]["stats"]
    assert (d.waiting, d.pending) == (2, 1)
    assert rows["api"]["limits"] == "4 at once, 100/m" and rows["default"]["limits"] == "-"  # no job: listed
    page = response.content.decode()
    assert 'class="seg rws-seg-waiting"' in page and "waiting for a key" in page
    assert set(result_ids(admin_client.get(f"{JOBS}?queue=default&status__exact=waiting"))) == {"w1", "w2"}


# ---- schedules ----------------------------------------------------------------------------

SCHEDULE_SETTINGS = {
    "SCHEDULES": {
        "nightly": {"cron": "0 0 3 * * *", "job_type": "test.noop"},
        "pulse": {"cron": "*/15 * * * * *", "job_type": "test.record", "payload": "beat"},
        "changed": {"cron": "0 0 * * * *", "job_type": "test.noop"},
        "broken": {"cron": "61 * * * * *", "job_type": "test.noop"},
    }
}


def test_schedules_list_says_what_each_does(admin_client, settings):
    settings.RWS_JOBS = {**settings.RWS_JOBS, **SCHEDULE_SETTINGS}
    t = now()
    JobSchedule.objects.create(name="nightly", next_run_at=t + 7200, cron="0 0 3 * * *")
    JobSchedule.objects.create(name="changed", next_run_at=t + 60, cron="0 0 4 * * *")
    JobSchedule.objects.create(name="gone", next_run_at=t - 60, cron="0 0 5 * * *")
    JobSchedule.objects.create(name="from-rust", next_run_at=t + 30)
    response = admin_client.get(SCHEDULES)
    assert response.status_code == 200
    assert result_ids(response) == ["changed", "from-rust", "gone", "nightly"]
    page = response.content.decode()
    assert "at 03:00:00 UTC every day" in page and "in 2 h" in page
    assert "not declared: the scheduler leaves this row alone" in page
    assert "the changed expression takes effect at the next tick" in page
    # Declared but not stored yet: listed above the table with its first due time.
    unstored = page.split('id="rws-unstored-schedules"')[1].split("</div>")[0]
    assert "pulse" in unstored and "every 15 seconds" in unstored and "nightly" not in unstored
    invalid = page.split('id="rws-invalid-schedules"')[1].split("</div>")[0]
    assert "broken" in invalid and "rws_jobs.E101" in invalid


def test_schedule_rows_delete_only_when_undeclared(admin_client, settings):
    settings.RWS_JOBS = {**settings.RWS_JOBS, **SCHEDULE_SETTINGS}
    JobSchedule.objects.create(name="nightly", next_run_at=now() + 60, cron="0 0 3 * * *")
    JobSchedule.objects.create(name="gone", next_run_at=now() + 60, cron="0 0 5 * * *")
    detail = admin_client.get(reverse("admin:django_rws_jobs_jobschedule_change", args=["nightly"]))
    assert detail.status_code == 200 and "at 03:00:00 UTC every day" in detail.content.decode()
    assert (
        admin_client.post(
            reverse("admin:django_rws_jobs_jobschedule_delete", args=["nightly"]), {"post": "yes"}
        ).status_code
        == 403
    )
    admin_client.post(reverse("admin:django_rws_jobs_jobschedule_delete", args=["gone"]), {"post": "yes"})
    assert list(JobSchedule.objects.values_list("name", flat=True)) == ["nightly"]
    assert admin_client.get(reverse("admin:django_rws_jobs_jobschedule_add")).status_code == 403


def test_the_admin_index_links_to_the_queue_overview(client, django_user_model):
    from django.contrib.auth.models import Permission

    staff = django_user_model.objects.create_user("viewer-ov", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(staff)
    index = client.get("/admin/")
    assert "/admin/django_rws_jobs/queueoverview/" in index.content.decode()
    response = client.get("/admin/django_rws_jobs/queueoverview/")
    assert response.status_code == 302
    assert response["Location"].endswith("/admin/django_rws_jobs/job/overview/")
    nobody = django_user_model.objects.create_user("nobody-ov", password="pw", is_staff=True)
    client.force_login(nobody)
    assert "queueoverview" not in client.get("/admin/").content.decode()
    assert client.get("/admin/django_rws_jobs/queueoverview/").status_code == 403


def test_a_jobs_progress_and_metadata_show_on_its_page_and_in_the_list(admin_client):
    """A handler's progress (a bar where it gave a total) and the job's metadata, as JSON."""
    job_id = rws.enqueue("test.report", '{"steps": 4, "fail": true}', metadata={"tenant": "acme <&>"})
    assert rws.tick()  # fails, keeping its last progress and metadata
    page = admin_client.get(reverse("admin:django_rws_jobs_job_change", args=[job_id])).content.decode()
    assert re.search(r'<progress class="rws-progress" value="1000" max="1000" title="4 / 4 step 4">', page)
    assert "100%" in page
    assert "&quot;tenant&quot;: &quot;acme &lt;&amp;&gt;&quot;" in page  # escaped JSON
    listing = admin_client.get(f"{JOBS}?status__exact=failed").content.decode()
    assert 'title="4 / 4 step 4"' in listing
    plain = rws.enqueue("test.record", "x")
    page = admin_client.get(reverse("admin:django_rws_jobs_job_change", args=[plain])).content.decode()
    assert "rws-progress" not in page


def test_a_jobs_list_shows_a_row_whose_stored_progress_is_out_of_range(admin_client):
    """One row with a report no float can hold (written by another program) does not break the
    jobs list nor its page (queue/progress.py parse_progress)."""
    job_id = rws.enqueue("test.record", "x")
    huge = '{"current": 1%s, "total": 3}' % ("0" * 400)
    Job.objects.filter(id=job_id).update(progress=huge, progress_at=1.0)
    assert admin_client.get(JOBS).status_code == 200
    page = admin_client.get(reverse("admin:django_rws_jobs_job_change", args=[job_id]))
    assert page.status_code == 200
    assert "nan / 3" in page.content.decode()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("page", [False, True])
def test_deleting_a_dead_dependency_cancels_what_waits_for_its_retry(admin_client, page):
    """The admin's deletes, as rws.delete: a "wait" for the dead job's retry can never end."""
    from tests.conftest import drain

    dead = rws.enqueue("test.fail", "x", max_retries=0)
    drain()
    waits = rws.enqueue("test.record", "w", after=[dead], on_dependency_failure="wait")
    if page:
        admin_client.post(reverse("admin:django_rws_jobs_failedjob_delete", args=[dead]), {"post": "yes"})
    else:
        delete_post(admin_client, dead, confirm=True)
    assert not Job.objects.filter(id=dead).exists()
    assert Job.objects.get(id=waits).status == "cancelled"


# ---- the pages together ------------------------------------------------------------------

#: The app's seven admin pages (docs/howto/admin.md, "The pages at a glance"), in the order of
#: their links.
PAGES = {
    "Queue overview": OVERVIEW,
    "Jobs": JOBS,
    "Dead-letter list": DEAD,
    "Schedules": SCHEDULES,
    "Workers": reverse("admin:django_rws_jobs_worker_changelist"),
    "Batches": reverse("admin:django_rws_jobs_batchrecord_changelist"),
    "Task results": reverse("admin:django_rws_jobs_taskresultrecord_changelist"),
}


def tool_links(html: str) -> list[str]:
    """The hrefs of a page's top-right buttons (Django's object-tools list)."""
    tools = re.search(r'<ul class="object-tools">(.*?)</ul>', html, re.S)
    assert tools, "the page has no object-tools list"
    return re.findall(r'<a href="([^"]+)"', tools.group(1))


def test_every_page_links_to_every_other_page(admin_client):
    """Each of the seven pages carries the same links, in the same order: the six others."""
    everything = list(PAGES.values())
    for name, url in PAGES.items():
        response = admin_client.get(url, follow=True)
        assert response.status_code == 200, name
        assert tool_links(response.content.decode()) == [u for u in everything if u != url], name


def test_a_job_page_links_to_every_page(admin_client):
    make_job("dead-1", status="failed")
    for url in (
        reverse("admin:django_rws_jobs_job_change", args=["dead-1"]),
        reverse("admin:django_rws_jobs_failedjob_change", args=["dead-1"]),
    ):
        links = tool_links(admin_client.get(url).content.decode())
        assert [u for u in links if u in PAGES.values()] == list(PAGES.values()), url


ACTIONS_BUTTON = re.compile(r'<button type="submit" class="button"[^>]*name="index"[^>]*>([^<]*)</button>')


@pytest.fixture
def project_actions_template(tmp_path, settings):
    """A project's own admin/actions.html, as a project may override Django's."""
    (tmp_path / "admin").mkdir()
    (tmp_path / "admin" / "actions.html").write_text(
        '{% extends "admin/actions.html" %}{% block actions-submit %}'
        '<button type="submit" class="button" name="index" value="0">Apply</button>{% endblock %}'
    )
    # The project's folder first, before the apps' templates (Django's own included).
    settings.TEMPLATES = [{**settings.TEMPLATES[0], "DIRS": [str(tmp_path)]}]
    return "Apply"


@pytest.mark.parametrize("override", [False, True], ids=["django", "project-override"])
def test_action_buttons_read_alike(admin_client, request, override):
    """The lists with actions (jobs, dead-letter list, batches) show Django's own button, as
    Django's pages do (the user list): "Go" before Django 6.0, "Run" since, or a project's own."""
    make_job("dead-1", status="failed")
    make_job("pending-1")
    with rws.batch(description="import") as b:
        b.enqueue("test.record", "row", run_in=600)
    expected = request.getfixturevalue("project_actions_template") if override else None
    buttons = {}
    for url in (JOBS, DEAD, PAGES["Batches"], reverse("admin:auth_user_changelist")):
        found = ACTIONS_BUTTON.findall(admin_client.get(url).content.decode())
        assert found, url
        buttons[url] = set(found)
    assert len(set(map(frozenset, buttons.values()))) == 1, buttons
    if expected:
        assert buttons[DEAD] == {expected}
