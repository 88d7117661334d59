"""A job's outcome decided by its handler (Snooze, Retry, Fail, Cancel) and by its type
(``backoff=``, ``fail_on=``), with the jitter of RWS_JOBS["BACKOFF_JITTER"]: in tick() here, and
in real worker processes of both pools at the end."""

import logging
import math
import pickle
from datetime import timedelta

import pytest
from django.test import override_settings

import django_rws_jobs as rws
from django_rws_jobs import Retry, Snooze
from django_rws_jobs.attempts.outcomes import CancelledByHandler, Failure, Snoozed, retry_at
from django_rws_jobs.database import clock
from django_rws_jobs.exceptions import DELAY_MAX
from django_rws_jobs.models import Job, MetricMinute
from django_rws_jobs.queue.backoff import Backoff
from django_rws_jobs.signals import job_cancelled, job_dead
from tests.test_worker import workers  # noqa: F401  (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sent():
    """The (signal name, job id) of each job_dead and job_cancelled sent, in order."""
    got: list[tuple[str, str]] = []

    def dead(sender, job, **kwargs):
        got.append(("dead", job.id))

    def cancelled(sender, job, **kwargs):
        got.append(("cancelled", job.id))

    job_dead.connect(dead, weak=False)
    job_cancelled.connect(cancelled, weak=False)
    yield got
    job_dead.disconnect(dead)
    job_cancelled.disconnect(cancelled)


def run_one(job_type: str, payload: str, **options) -> tuple[Job, float, float]:
    """Enqueue one job, run it by tick(); its row after, and the queue's clock before and after."""
    job_id = rws.enqueue(job_type, payload, **options)
    before = clock.now()
    assert rws.tick() is True
    after = clock.now()
    return Job.objects.get(id=job_id), before, after


def due_within(job: Job, before: float, after: float, low: float, high: float) -> bool:
    """Whether the job is due between before + low and after + high (rounded up, as written)."""
    return math.ceil(before + low) <= job.next_run_at <= math.ceil(after + high)


def test_a_snooze_puts_the_job_back_without_charging_an_attempt():
    job, before, after = run_one("test.decide", "snooze 30", unique="k")
    assert (job.status, job.attempts, job.snoozes, job.last_error) == ("pending", 0, 1, None)
    assert due_within(job, before, after, 30, 30)
    assert job.unique_hash is not None  # the key stays held
    assert rws.enqueue("test.decide", "snooze 30", unique="k") == job.id
    Job.objects.filter(id=job.id).update(next_run_at=0)
    rws.tick()
    job.refresh_from_db()
    assert (job.status, job.attempts, job.snoozes) == ("pending", 0, 2)


def test_a_snooze_takes_a_timedelta():
    job, before, after = run_one("test.decide", "snooze 0")
    assert (job.status, job.snoozes) == ("pending", 1)
    assert job.next_run_at <= math.ceil(after)
    with pytest.raises(ValueError, match="Snooze"):
        Snooze(timedelta(days=-1))
    assert Snooze(timedelta(minutes=2)).seconds == 120


@pytest.mark.parametrize(
    "make, match",
    [
        (
            lambda: Snooze(-1),
            r"Snooze\(seconds\) must be a finite number of seconds in \[0, 31536000\], got -1",
        ),
        (lambda: Snooze(math.nan), r"got nan"),
        (lambda: Snooze(math.inf), r"got inf"),
        (lambda: Snooze(DELAY_MAX + 1), r"31536001"),
        (lambda: Retry(-0.5), r"Retry\(delay\) must be .* got -0.5"),
        (lambda: Snooze("soon"), r"must be a number of seconds or a timedelta, got 'soon'"),
        (lambda: Snooze(True), r"got True"),
    ],
)
def test_a_bad_delay_is_a_clear_error(make, match):
    with pytest.raises((TypeError, ValueError), match=match):
        make()


def test_a_bad_snooze_in_a_handler_is_a_failure_on_the_backoff():
    rws.register("test.bad_snooze", lambda payload: (_ for _ in ()).throw(Snooze(-5)))
    try:
        job, _, _ = run_one("test.bad_snooze", "")
    finally:
        from django_rws_jobs.queue.registry import registry

        registry.unregister("test.bad_snooze")
    assert (job.status, job.attempts, job.snoozes) == ("pending", 1, None)
    assert job.last_error.startswith("ValueError: Snooze(seconds) must be a finite number")


def test_a_retry_with_a_delay_is_charged_and_exact():
    job, before, after = run_one("test.decide", "retry 120 rate limited")
    assert (job.status, job.attempts, job.last_error) == ("pending", 1, "Retry: rate limited")
    assert due_within(job, before, after, 120, 120)
    assert "raise Retry(" in job.traceback


def test_a_retry_without_a_delay_keeps_the_backoff():
    job, before, after = run_one("test.decide", "retry")
    assert (job.status, job.attempts) == ("pending", 1)
    assert due_within(job, before, after, 0.5 * 0.9, 0.5 * 1.1)  # tests/settings.py: 0.5 s


def test_a_retry_out_of_retries_is_dead(sent):
    job, _, _ = run_one("test.decide", "retry 1 again", max_retries=0)
    assert (job.status, job.attempts, job.last_error) == ("failed", 1, "Retry: again")
    assert sent == [("dead", job.id)]


def test_fail_is_dead_now_whatever_retries_are_left(sent):
    job, _, _ = run_one("test.decide", "fail row 3 is gone", max_retries=5, unique="u")
    assert (job.status, job.attempts, job.last_error) == ("failed", 1, "Fail: row 3 is gone")
    assert job.unique_hash is None and job.failed_at is not None
    assert sent == [("dead", job.id)]


def test_cancel_ends_the_job_cancelled_by_its_handler(sent):
    job, _, _ = run_one("test.decide", "cancel obsolete", unique="c")
    assert (job.status, job.attempts, job.cancelled_by) == ("cancelled", 0, "handler")
    assert job.last_error == "Cancel: obsolete" and job.unique_hash is None
    assert sent == [("cancelled", job.id)]


def test_a_handler_that_catches_a_decision_and_returns_has_succeeded():
    job_id = rws.enqueue("test.decide", "catch")
    assert rws.tick() is True
    assert not Job.objects.filter(id=job_id).exists()


def test_fail_on_makes_an_exception_a_fail(sent):
    job, _, _ = run_one("test.fail_on", "lookup x", max_retries=3)
    assert (job.status, job.attempts) == ("failed", 1)
    assert job.last_error == "KeyError: 'x'"
    other, _, _ = run_one("test.fail_on", "error", max_retries=3)
    assert (other.status, other.attempts) == ("pending", 1)  # not in fail_on: retried


@override_settings(RWS_JOBS={"BACKOFF_JITTER": 0.0})
def test_a_callable_backoff_gets_the_attempt_and_the_error():
    job, before, after = run_one("test.typed_backoff", "lookup k")
    assert job.attempts == 1 and due_within(job, before, after, 107, 107)
    Job.objects.filter(id=job.id).update(next_run_at=0)
    before = clock.now()
    rws.tick()
    after = clock.now()
    job.refresh_from_db()
    assert job.attempts == 2 and due_within(job, before, after, 207, 207)


def test_a_callable_backoff_is_spread_by_the_jitter():
    job, before, after = run_one("test.typed_backoff", "error")
    assert job.attempts == 1 and due_within(job, before, after, 90, 110)


def test_a_dict_backoff_replaces_the_settings_numbers():
    job, before, after = run_one("test.dict_backoff", "error")
    assert due_within(job, before, after, 50, 50)  # its own jitter: 0
    Job.objects.filter(id=job.id).update(next_run_at=0)
    before = clock.now()
    rws.tick()
    after = clock.now()
    job.refresh_from_db()
    assert due_within(job, before, after, 150, 150)


@pytest.mark.parametrize("job_type", ["test.raising_backoff", "test.garbage_backoff"])
def test_a_backoff_that_fails_is_logged_and_the_settings_backoff_applies(job_type, caplog):
    with caplog.at_level(logging.ERROR, logger="django_rws_jobs"):
        job, before, after = run_one(job_type, "error")
    assert (job.status, job.attempts) == ("pending", 1)
    assert due_within(job, before, after, 0.5 * 0.9, 0.5 * 1.1)
    assert f"({job_type}): its type's backoff failed" in caplog.text


@override_settings(RWS_JOBS={"BACKOFF_INITIAL": 100, "BACKOFF_JITTER": 0.2})
def test_the_settings_backoff_is_spread_either_way_never_more():
    now = 1_000_000.0
    dues = [retry_at(1, now) - now for _ in range(400)]
    assert 80 <= min(dues) < 90 and 110 < max(dues) <= 120
    assert retry_at(1, now, delay=7.0) == now + 7  # a delay decided already is kept


@pytest.mark.parametrize(
    "options, error",
    [
        ({"backoff": 3}, "backoff must be a callable backoff(attempt, error) -> seconds or a dict"),
        ({"backoff": {"start": 1}}, "backoff has unknown key(s) ['start']"),
        ({"backoff": {"initial": -1}}, "backoff initial -1 is out of range; it must be in [0, 31536000]"),
        ({"backoff": {"multiplier": 0.5}}, "backoff multiplier 0.5 is out of range"),
        ({"backoff": {"jitter": 1}}, "backoff jitter 1 is out of range; it must be in [0, 1)"),
        ({"backoff": {"max": math.inf}}, "backoff max inf is out of range"),
        ({"fail_on": ("KeyError",)}, "fail_on must be exception classes, got str 'KeyError'"),
    ],
)
def test_bad_outcome_options_are_refused_at_registration(options, error):
    with pytest.raises((TypeError, ValueError)) as raised:
        rws.register("test.bad_options", lambda payload: None, **options)
    assert str(raised.value).startswith(f"job_type 'test.bad_options': {error}")
    from django_rws_jobs.queue.registry import registry

    assert "test.bad_options" not in registry


@pytest.mark.parametrize("value", [-0.1, 1, 1.5, math.nan, "0.1", None])
def test_a_bad_jitter_setting_is_a_check_error(value):
    from django_rws_jobs.checks import check_settings

    with override_settings(RWS_JOBS={"BACKOFF_JITTER": value}):
        errors = check_settings(None)
    assert [e.id for e in errors] == ["rws_jobs.E031"]
    assert "a number in [0, 1)" in errors[0].msg


def test_the_outcomes_pickle_for_the_process_pool():
    for outcome in (
        Snoozed("Snooze: snoozed for 3 s", 3.0),
        Failure("Fail: x", None, True),
        Failure("e", 4.5),
    ):
        back = pickle.loads(pickle.dumps(outcome, pickle.HIGHEST_PROTOCOL))
        assert type(back) is type(outcome) and back == outcome and vars(back) == vars(outcome)
    cancelled = pickle.loads(pickle.dumps(CancelledByHandler("Cancel: x")))
    assert type(cancelled) is CancelledByHandler and cancelled.requested is False
    assert Backoff.of({"initial": 2}).delay(3, ValueError()) == 8  # the setting's multiplier: 2


def test_decisions_keep_a_batch_member_outstanding_or_settle_it(sent):
    with rws.batch() as b:
        snoozed = b.enqueue("test.decide", "snooze 600")
        failed = b.enqueue("test.decide", "fail for good", max_retries=3)
        cancelled = b.enqueue("test.decide", "cancel no longer needed")
    while rws.tick():
        pass
    assert Job.objects.get(id=snoozed).status == "pending"
    batch = rws.get_batch(b.id)
    assert (batch.state, batch.failed, batch.cancelled, batch.pending) == ("sealed", 1, 1, 1)
    assert sorted(sent) == sorted([("dead", failed), ("cancelled", cancelled)])


def test_fail_and_cancel_resolve_dependents_as_a_dead_or_cancelled_job_does(sent):
    failed = rws.enqueue("test.decide", "fail x", max_retries=2)
    cancelled = rws.enqueue("test.decide", "cancel y")
    after_failed = rws.enqueue("test.record", "a", after=[failed])
    after_cancelled = rws.enqueue("test.record", "b", after=[cancelled], on_dependency_failure="run")
    while rws.tick():
        pass
    assert Job.objects.get(id=after_failed).status == "cancelled"
    assert not Job.objects.filter(id=after_cancelled).exists()  # released, then ran
    assert ("cancelled", after_failed) in sent


def test_a_snoozed_job_frees_its_concurrency_slot_for_the_next_job_of_its_key():
    first = rws.enqueue("test.decide", "snooze 600", concurrency_key="k")
    second = rws.enqueue("test.decide", "catch", concurrency_key="k")
    assert Job.objects.get(id=second).status == "waiting"
    assert rws.tick() is True  # the first snoozes: waiting again, its slot given to the second
    assert Job.objects.get(id=first).status == "waiting"
    assert Job.objects.get(id=second).status == "pending"
    assert rws.tick() is True
    assert not Job.objects.filter(id=second).exists()
    assert Job.objects.get(id=first).snoozes == 1


def test_rust_sees_a_snoozed_job_as_a_plain_pending_row():
    job, _, _ = run_one("test.decide", "snooze 60")
    from django.db import connection

    with connection.cursor() as c:  # the crate's columns only, as its claim reads them
        c.execute(
            "SELECT status, attempts, max_retries, next_run_at, last_error FROM rws_jobs WHERE id = %s",
            [job.id],
        )
        assert c.fetchone() == ("pending", 0, job.max_retries, job.next_run_at, None)


DECISIONS = ["snooze 3600", "retry 3600 slow down", "fail gone", "cancel obsolete", "catch"]


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_each_decision_in_a_worker_process(workers, pool):  # noqa: F811
    ids = {}
    for job_type in ("test.decide", "test.async_decide"):
        for payload in DECISIONS:
            ids[job_type, payload] = rws.enqueue(job_type, payload, max_retries=3)
    w = workers("--workers", "2", "--pool", pool, "--burst", "--no-schedules")
    assert w.wait() == 0, w.output()
    for job_type in ("test.decide", "test.async_decide"):
        rows = {p: Job.objects.filter(id=ids[job_type, p]).first() for p in DECISIONS}
        snoozed, retried, failed, cancelled = (rows[p] for p in DECISIONS[:4])
        assert (snoozed.status, snoozed.attempts, snoozed.snoozes) == ("pending", 0, 1), job_type
        assert (retried.status, retried.attempts, retried.last_error) == ("pending", 1, "Retry: slow down")
        assert (failed.status, failed.attempts, failed.last_error) == ("failed", 1, "Fail: gone")
        assert (cancelled.status, cancelled.cancelled_by, cancelled.last_error) == (
            "cancelled",
            "handler",
            "Cancel: obsolete",
        )
        assert rows["catch"] is None  # succeeded: its row deleted
    assert "2 snoozed" in w.output()
    assert sum(MetricMinute.objects.values_list("snoozed", flat=True)) == 2  # the metrics count them


def test_the_admin_shows_snoozes(admin_client):
    from django.urls import reverse

    job, _, _ = run_one("test.decide", "snooze 60")
    Job.objects.filter(id=job.id).update(next_run_at=0)
    rws.tick()
    page = admin_client.get(reverse("admin:django_rws_jobs_job_change", args=[job.id])).content.decode()
    assert "0 of 4, snoozed 2" in page
    listing = admin_client.get(reverse("admin:django_rws_jobs_job_changelist")).content.decode()
    assert "0 of 4, snoozed 2" in listing


# ---- the operator's decisions (the admin) ----------------------------------------------------


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def admin_post(client, url: str, data: dict):
    return client.post(url, data, follow=True)


def test_run_now_and_reschedule(admin_client):
    from django.urls import reverse

    jobs_url = reverse("admin:django_rws_jobs_job_changelist")
    snoozed, _, _ = run_one("test.decide", "snooze 3600")
    later = rws.enqueue("test.record", "later", run_in=7200)
    done = rws.enqueue("test.decide", "fail x")
    rws.tick()  # done is dead now; the others wait
    response = admin_post(
        admin_client,
        jobs_url,
        {"action": "run_now_selected", "index": "0", "_selected_action": [snoozed.id, later, done]},
    )
    assert messages_of(response) == [
        "2 jobs are due now.",
        "1 job was left as it is: it is running or has ended.",
    ]
    assert all(j.next_run_at <= clock.now() + 1 for j in Job.objects.filter(id__in=[snoozed.id, later]))
    assert Job.objects.get(id=done).status == "failed"
    # Reschedule: a page asks for the time, then the jobs move to it.
    ask = admin_client.post(
        jobs_url, {"action": "reschedule_selected", "index": "0", "_selected_action": [snoozed.id, later]}
    )
    page = ask.content.decode()
    assert ask.status_code == 200 and 'name="rws_due"' in page and page.count('name="_selected_action"') == 2
    data = {"action": "reschedule_selected", "index": "0", "_selected_action": [snoozed.id, later]}
    bad = admin_post(admin_client, jobs_url, {**data, "rws_due": "tomorrow"})
    assert messages_of(bad)[0].startswith("'tomorrow' is not a date and time (YYYY-MM-DD HH:MM, in UTC)")
    assert 'name="rws_due"' in bad.content.decode()  # asked again, nothing moved
    moved = admin_post(admin_client, jobs_url, {**data, "rws_due": "2031-01-02T03:04"})
    assert messages_of(moved) == ["2 jobs are due at 2031-01-02 03:04:00 UTC."]
    assert set(Job.objects.filter(id__in=[snoozed.id, later]).values_list("next_run_at", flat=True)) == {
        1925089440  # 2031-01-02 03:04 UTC
    }


def test_run_now_needs_the_change_permission(django_user_model):
    from django.urls import reverse

    from tests.test_admin import staff

    job_id = rws.enqueue("test.record", "x", run_in=600)
    viewer = staff(django_user_model, "viewer", "view_job")
    jobs_url = reverse("admin:django_rws_jobs_job_changelist")
    page = viewer.get(jobs_url).content.decode()
    assert "run_now_selected" not in page and "reschedule_selected" not in page
    viewer.post(jobs_url, {"action": "run_now_selected", "index": "0", "_selected_action": [job_id]})
    assert Job.objects.get(id=job_id).next_run_at > clock.now() + 500  # not moved
    mover = staff(django_user_model, "mover", "view_job", "change_job")
    assert "run_now_selected" in mover.get(jobs_url).content.decode()


def test_a_dead_jobs_payload_is_edited_and_retried(admin_client, django_user_model):
    from django.urls import reverse

    from tests.test_admin import staff

    job, _, _ = run_one("test.decide", "fail bad input")
    page_url = reverse("admin:django_rws_jobs_failedjob_change", args=[job.id])
    page = admin_client.get(page_url).content.decode()
    assert "Retry with this payload" in page and "fail bad input</textarea>" in page
    retry_url = reverse("admin:django_rws_jobs_failedjob_retry", args=[job.id])
    viewer = staff(django_user_model, "viewer", "view_failedjob")
    assert "Retry with this payload" not in viewer.get(page_url).content.decode()
    assert viewer.post(retry_url, {"payload": "catch"}).status_code == 403
    response = admin_post(admin_client, retry_url, {"payload": "catch\r\n"})
    assert messages_of(response) == ["Retried 1 dead job with the edited payload; it is due now."]
    job.refresh_from_db()
    assert (job.status, job.payload, job.attempts) == ("pending", "catch\n", 0)
    again = admin_post(admin_client, retry_url, {"payload": "other"})
    assert "was not retried and its payload is unchanged" in messages_of(again)[0]
    assert Job.objects.get(id=job.id).payload == "catch\n"


def test_every_dead_job_a_search_shows_is_retried_not_only_the_page(admin_client):
    from django.urls import reverse

    dead_url = reverse("admin:django_rws_jobs_failedjob_changelist")
    for i in range(5):
        rws.enqueue("test.decide", f"fail timeout {i}")
    for i in range(3):
        rws.enqueue("test.decide", f"fail quota {i}")
    while rws.tick():
        pass
    listed = admin_client.get(dead_url, {"q": "quota"}).content.decode()
    assert listed.count('name="_selected_action"') == 3
    response = admin_post(
        admin_client,
        f"{dead_url}?q=quota",
        {"action": "retry_selected", "index": "0", "select_across": "1", "_selected_action": ["x"]},
    )
    assert messages_of(response)[0] == "Retried 3 dead jobs; they are due now."
    assert sorted(Job.objects.filter(status="pending").values_list("payload", flat=True)) == [
        f"fail quota {i}" for i in range(3)
    ]
    assert Job.objects.filter(status="failed").count() == 5
