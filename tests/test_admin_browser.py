"""The admin in a real Chromium: log in, retry and delete dead jobs, look at the overview.

Uses Debian's chromium (scripts/_env.sh installs it); nothing is downloaded. Takes the screenshots
that docs/howto/admin.md shows; ``RWS_SCREENSHOTS=docs`` writes them over the ones in docs/.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from django.contrib import admin
from django.db import connections

import django_rws_jobs as rws
from django_rws_jobs.models import Job

# Playwright's sync API runs an event loop in this thread, and Django refuses ORM calls from a
# thread with a running loop unless told it is safe; here the calls never overlap.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CHROMIUM = os.environ.get("RWS_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DOCS = Path(__file__).resolve().parent.parent / "docs"
# Screenshots go to docs/ when asked (RWS_SCREENSHOTS=docs) or when missing there; otherwise to the
# tests' scratch folder, so a test run does not leave the committed pictures modified.
SHOTS = (
    DOCS
    if os.environ.get("RWS_SCREENSHOTS") == "docs"
    else Path(os.environ.get("RWS_TEST_TMP", Path(__file__).resolve().parent / ".tmp"))
)


def screenshot(page, name: str) -> None:
    target = SHOTS if (DOCS / name).exists() else DOCS
    target.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(target / name), full_page=True)
    assert (target / name).stat().st_size > 10_000  # a real page, not an empty one


sync_api = pytest.importorskip("playwright.sync_api")
if not shutil.which(CHROMIUM):
    pytest.skip(f"no Chromium at {CHROMIUM} (scripts/_env.sh installs Debian's)", allow_module_level=True)


@pytest.fixture
def page(live_server, settings, django_user_model):
    # The test settings have no staticfiles app; the live server serves STATIC_ROOT, so point it at
    # the admin's own files and the pages look as they do in a project.
    settings.STATIC_ROOT = str(Path(admin.__file__).parent / "static")
    django_user_model.objects.create_superuser("admin", "admin@example.com", "admin")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1440, "height": 800})
            page = context.new_page()
            page.set_default_timeout(15_000)
            page.goto(f"{live_server.url}/admin/login/")
            page.fill("#id_username", "admin")
            page.fill("#id_password", "admin")
            page.click("input[type=submit]")
            page.wait_for_selector("#site-name")
            # The admin's nav sidebar closed, as its toggle leaves it: room for the tables.
            page.evaluate("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
            yield page
        finally:
            browser.close()
            # The test's ORM calls inside sync_playwright() run in another context (greenlet), so
            # Django hands them another connection; close it, or PostgreSQL cannot drop the test
            # database at the end ("is being accessed by other users").
            connections.close_all()


def dead_jobs(*payloads: str, queue: str = "default") -> list[str]:
    """Jobs that really failed: enqueued without retries and run once by tick()."""
    ids = [rws.enqueue("test.fail", p, queue=queue, max_retries=0) for p in payloads]
    while rws.tick():
        pass
    assert Job.objects.filter(id__in=ids, status="failed").count() == len(ids)
    return ids


def some_traffic() -> None:
    t = int(time.time())
    for i in range(12):
        rws.enqueue("test.record", f"receipt {i}", queue="mailers", run_in=600)
    for i in range(5):
        job_id = rws.enqueue("test.record", f"late {i}", queue="mailers")
        Job.objects.filter(id=job_id).update(next_run_at=t - 90)
    for i in range(3):
        job_id = rws.enqueue("test.record", f"report {i}", queue="reports")
        Job.objects.filter(id=job_id).update(status="running", locked_until=t + 60, locked_by="web-1:1")
    for i in range(7):
        rws.enqueue("test.record", f"thumb {i}", queue="default", run_in=120)


def some_activity() -> None:
    """A day of the workers' counters: busy mornings, a few failures, one bad quarter hour."""
    from django.db import connection

    from django_rws_jobs.database.backends.claimed import Claimed
    from django_rws_jobs.operations import metrics
    from django_rws_jobs.queue.store import Store

    now = int(time.time())
    job = Claimed("id", "shop.send_receipt", "", "mailers", 0, 0, 3, now, now, None, None, None, None, "t")
    counters = metrics.Counters()
    for minutes_ago in range(0, 24 * 60, 3):
        done = 20 + (minutes_ago * 7) % 40
        failed = 30 if 300 <= minutes_ago < 315 else minutes_ago % 5
        counters.ended([job] * (done + failed), ["done"] * done + ["retry"] * failed)
        metrics.write(Store(connection), counters.take(now - 60 * minutes_ago, now))


def test_retry_and_delete_from_the_dead_letter_list(page, live_server):
    keep, retry_me, delete_me = dead_jobs("order 1", "order 2", "<script>alert(1)</script>")
    dead_jobs("newsletter 3", queue="mailers")

    page.goto(f"{live_server.url}/admin/django_rws_jobs/failedjob/")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 4
    assert page.locator("#result_list").inner_text().count("ValueError: boom") == 4
    screenshot(page, "admin-dead-letter.png")

    page.check(f"input[name=_selected_action][value='{retry_me}']")
    page.select_option("select[name=action]", "retry_selected")
    page.click("button[name=index]")
    page.wait_for_selector(".messagelist")
    assert "Retried 1 dead job; it is due now." in page.locator(".messagelist").inner_text()
    assert page.locator(f"input[name=_selected_action][value='{retry_me}']").count() == 0
    assert page.locator("#result_list tbody tr").count() == 3
    assert Job.objects.get(id=retry_me).status == "pending"

    # Delete asks first, on a page of its own, and the payload stays text.
    page.check(f"input[name=_selected_action][value='{delete_me}']")
    page.select_option("select[name=action]", "delete_selected")
    page.click("button[name=index]")
    page.wait_for_selector("text=Are you sure you want to delete 1 dead job?")
    assert Job.objects.filter(id=delete_me).exists()
    page.click("input[type=submit][value^='Yes']")
    page.wait_for_selector(".messagelist")
    assert "Deleted 1 dead job." in page.locator(".messagelist").inner_text()
    assert not Job.objects.filter(id=delete_me).exists()
    assert Job.objects.get(id=keep).status == "failed"


def test_overview_page(page, live_server, settings):
    settings.RWS_JOBS = {
        **settings.RWS_JOBS,
        "QUEUES": {"mailers": {"concurrency": 2, "rate_limit": "100/m"}},
    }
    dead_jobs("order 1", "order 2")
    dead_jobs("newsletter 3", queue="mailers")
    some_traffic()
    for i in range(4):  # a sync per account at a time: the first takes the slot, 3 wait for it
        rws.enqueue("test.keyed", f"sync {i}", concurrency_key="account:1", queue="reports")
    some_activity()
    page.goto(f"{live_server.url}/admin/django_rws_jobs/job/")
    page.click("#content >> text=Queue overview")  # the link on the jobs page, not the sidebar
    page.wait_for_selector("#rws-queues")
    mailers = page.locator("#rws-queues tr[data-queue=mailers] td")
    # state, limits, waiting for a key, pending, due now, oldest due waited
    assert [mailers.nth(i).inner_text() for i in (1, 2, 3, 4, 5)] == [
        "2 at once, 100/m",
        "0",
        "17",
        "5",
        "2 min",
    ]
    assert page.locator("#rws-queues tr[data-queue=reports] td").nth(2).inner_text() == "3"
    assert page.locator("#rws-activity svg").count() == 2
    assert (
        page.locator("#rws-activity figure[data-span='1'] rect.rws-seg-running").count() == 20
    )  # every 3rd minute
    assert page.locator(".rws-chart .row").count() == 3
    # Pause and resume with the row's button (a POST with the CSRF token).
    page.click("#rws-queues tr[data-queue=mailers] button[value=pause]")
    page.wait_for_selector("text=Paused queue mailers")
    assert rws.paused_queues() == ["mailers"]
    assert mailers.nth(0).inner_text().startswith("paused")
    screenshot(page, "admin-overview.png")
    page.click("#rws-queues tr[data-queue=mailers] button[value=resume]")
    page.wait_for_selector("text=Resumed queue mailers")
    assert rws.paused_queues() == []
    page.click("#rws-queues tr[data-queue=mailers] td:nth-of-type(5) a")  # the "due now" count
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == 5


def test_workers_page_and_cancelling_from_the_jobs_list(page, live_server):
    """The Workers page lists a live and a dead worker with the job each holds (linked); the jobs
    list's Cancel action cancels the selected jobs."""
    from django.db import connection

    from django_rws_jobs.operations.worker_rows import Registration
    from django_rws_jobs.queue.store import Store

    store = Store(connection)
    now = int(time.time())
    held = rws.enqueue("test.record", "report 7", queue="reports")
    Job.objects.filter(id=held).update(
        status="running", locked_until=now + 60, locked_by="web-1:4121:3f2a#17"
    )
    Registration("web-1:4121:3f2a", ["reports", "mailers"], "processes", 4, 20.0).register(store, now - 3600)
    Registration("web-1:4121:3f2a", ["reports", "mailers"], "processes", 4, 20.0).beat(
        store, now - 5, [held], 812, 3, 0.0018
    )
    Registration("web-2:977:b7c1", None, "threads", 8, 20.0).register(store, now - 7200)
    Registration("web-2:977:b7c1", None, "threads", 8, 20.0).beat(store, now - 600, [], 15022, 41)
    page.goto(f"{live_server.url}/admin/django_rws_jobs/job/")
    page.click("#content >> text=Workers")
    page.wait_for_selector("#result_list")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 2
    texts = {rows.nth(i).inner_text().split("\t")[0]: rows.nth(i).inner_text() for i in range(2)}
    assert "\talive\t" in texts["web-1:4121:3f2a"] and "\tdead\t" in texts["web-2:977:b7c1"], texts
    assert texts["web-1:4121:3f2a"].endswith("\t1.8 ms"), texts  # its claims' p99
    screenshot(page, "admin-workers.png")
    page.click(f"#result_list a:text('{held}')")
    page.wait_for_selector(".field-payload_detail >> text=report 7")  # the job's page

    ids = [rws.enqueue("test.record", f"newsletter {i}", queue="mailers", run_in=600) for i in range(3)]
    page.goto(f"{live_server.url}/admin/django_rws_jobs/job/?queue=mailers")
    for job_id in ids[:2]:
        page.check(f"input[name=_selected_action][value='{job_id}']")
    page.select_option("select[name=action]", "cancel_selected")
    page.click("button[name=index]")
    page.wait_for_selector("text=Cancelled 2 jobs.")
    assert dict(Job.objects.filter(id__in=ids).values_list("id", "status")) == {
        ids[0]: "cancelled",
        ids[1]: "cancelled",
        ids[2]: "pending",
    }
    screenshot(page, "admin-cancel.png")


def test_batches_page_progress_and_actions(page, live_server):
    """The Batches page: a batch's progress bar and counts, its callbacks, outputs and metadata; its dead
    members through its page's link; a blocked job's page names what it waits for; the action
    that retries a batch's dead members."""
    with rws.batch(
        on_success=rws.call("test.record", "report"),
        on_failure=rws.call("test.record", "alert"),
        description="import 7",
        metadata={"import": 7, "by": "ops"},
    ) as b:
        for i in range(6):  # two of them keep an output
            b.enqueue("test.record", f"row {i}") if i > 1 else b.enqueue(
                "test.batch_output", f'{{"value": {i}}}'
            )
        dead = b.enqueue("test.fail", "row 6", max_retries=0)
        later = [b.enqueue("test.record", f"row {i}", run_in=3600) for i in (7, 8, 9)]
    while rws.tick():
        pass
    blocked = rws.enqueue("test.record", "summary", after=[b])
    page.goto(f"{live_server.url}/admin/django_rws_jobs/batchrecord/")
    row = page.locator("#result_list tbody tr").first
    assert "import 7" in row.inner_text() and "sealed" in row.inner_text()
    assert page.locator("progress.rws-progress").get_attribute("value") == "7"  # 6 succeeded, 1 dead
    screenshot(page, "admin-batches.png")
    page.click(f"#result_list a:text('{b.id}')")
    page.wait_for_selector(".field-counts >> text=10 members: 6 succeeded, 1 failed, 0 cancelled, 3 pending")
    assert "on_failure: test.record" in page.locator(".field-callback_detail").inner_text()
    assert '"import": 7' in page.locator(".field-metadata_detail").inner_text()
    assert page.locator(".field-outputs_detail").inner_text().split("\n")[-2:] == [
        f"{job_id}: {value}" for job_id, value in rws.get_batch(b.id).outputs()
    ]
    page.click(".field-members >> text=dead")
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == 1
    page.goto(f"{live_server.url}/admin/django_rws_jobs/job/{dead}/change/")
    assert f"{b.id} (member)" in page.locator(".field-batch_detail").inner_text()
    page.goto(f"{live_server.url}/admin/django_rws_jobs/job/{blocked}/change/")
    assert f"batch {b.id}: not ended" in page.locator(".field-dependency_detail").inner_text()
    page.goto(f"{live_server.url}/admin/django_rws_jobs/batchrecord/")
    page.check(f"input[name=_selected_action][value='{b.id}']")
    page.select_option("select[name=action]", "retry_failed_members")
    page.click("button[name=index]")
    page.wait_for_selector("text=Put 1 dead member back.")
    assert Job.objects.get(id=dead).status == "pending"
    assert set(Job.objects.filter(id__in=later).values_list("status", flat=True)) == {"pending"}


def test_a_jobs_progress_bar_and_metadata(page, live_server):
    """A job's page shows its handler's last progress as a bar, and its metadata as JSON."""
    job_id = rws.enqueue(
        "test.report", '{"steps": 3, "total": 4, "fail": true}', metadata={"tenant": "acme", "rows": 4}
    )
    assert rws.tick()  # fails, keeping its progress (3 of 4) and metadata
    page.goto(f"{live_server.url}/admin/django_rws_jobs/job/{job_id}/change/")
    bar = page.locator("progress.rws-progress")
    assert bar.get_attribute("value") == "750"
    assert bar.bounding_box()["width"] > 20  # drawn, not hidden
    assert "75%" in page.locator(".field-progress_detail").inner_text()
    assert '"tenant": "acme"' in page.locator(".field-metadata_detail").inner_text()
    page.goto(f"{live_server.url}/admin/django_rws_jobs/job/?status__exact=failed")
    assert page.locator("progress.rws-progress").get_attribute("title") == "3 / 4 step 3"


def test_every_page_shows_the_same_links(page, live_server):
    """Seen in the browser, each of the seven pages' top-right buttons name the six others."""
    from django.urls import reverse

    pages = {  # the link's text: the page's URL name
        "Queue overview": "job_overview",
        "All jobs": "job_changelist",
        "Dead-letter list": "failedjob_changelist",
        "Schedules": "jobschedule_changelist",
        "Workers": "worker_changelist",
        "Batches": "batchrecord_changelist",
        "Task results": "taskresultrecord_changelist",
    }
    for name, url_name in pages.items():
        page.goto(live_server.url + reverse(f"admin:django_rws_jobs_{url_name}"))
        shown = [text.strip() for text in page.locator("ul.object-tools a").all_text_contents()]
        assert shown == [n for n in pages if n != name], (name, shown)


def test_an_operator_edits_a_dead_payload_and_reschedules_jobs(page, live_server):
    (dead,) = dead_jobs("order 9")
    page.goto(f"{live_server.url}/admin/django_rws_jobs/failedjob/{dead}/change/")
    page.fill("#rws-payload", "order 9, fixed\nsecond line")
    page.click("input[type=submit][value='Retry with this payload']")
    page.wait_for_selector(".messagelist")
    assert "Retried 1 dead job with the edited payload" in page.locator(".messagelist").inner_text()
    job = Job.objects.get(id=dead)
    assert (job.status, job.payload) == ("pending", "order 9, fixed\nsecond line")

    waiting = rws.enqueue("test.record", "later", run_in=600)
    page.goto(f"{live_server.url}/admin/django_rws_jobs/job/")
    page.check(f"input[name=_selected_action][value='{waiting}']")
    page.select_option("select[name=action]", "reschedule_selected")
    page.click("button[name=index]")
    page.wait_for_selector("#rws_due")
    page.fill("#rws_due", "2031-01-02T03:04:05")
    page.click("input[type=submit][value='Reschedule']")
    page.wait_for_selector(".messagelist")
    assert "1 job is due at 2031-01-02 03:04:05 UTC." in page.locator(".messagelist").inner_text()
    assert Job.objects.get(id=waiting).next_run_at == 1925089445

    page.check(f"input[name=_selected_action][value='{waiting}']")
    page.select_option("select[name=action]", "run_now_selected")
    page.click("button[name=index]")
    page.wait_for_selector(".messagelist")
    assert "1 job is due now." in page.locator(".messagelist").inner_text()
    assert Job.objects.get(id=waiting).next_run_at <= time.time() + 1


def test_an_operator_reads_a_dead_long_jobs_checkpoint_and_restarts_it(page, live_server):
    from tests.testapp.models import Item

    Item.objects.bulk_create([Item(group="b", number=i) for i in range(6)])
    pks = list(Item.objects.order_by("pk").values_list("pk", flat=True))
    payload = f'{{"label": "b", "group": "b", "fail_at": {pks[3]}}}'
    dead = rws.enqueue("test.long_rows_dead", payload)
    assert rws.tick()
    page.goto(f"{live_server.url}/admin/django_rws_jobs/failedjob/{dead}/change/")
    page.get_by_text("Checkpoint", exact=True).click()  # a collapsed section: opened by a click
    shown = page.locator(".field-checkpoint_detail").inner_text()
    assert '"iterate-1": ' + str(pks[2]) in shown, shown
    page.goto(f"{live_server.url}/admin/django_rws_jobs/failedjob/")
    page.check(f"input[name=_selected_action][value='{dead}']")
    page.select_option("select[name=action]", "restart_selected")
    page.click("button[name=index]")
    page.wait_for_selector(".messagelist")
    assert "Retried 1 dead job from the beginning" in page.locator(".messagelist").inner_text()
    job = Job.objects.get(id=dead)
    assert (job.status, job.checkpoint) == ("pending", None)
