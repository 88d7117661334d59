"""Live workers: the rows of rws_workers, workers(), and the admin's Workers page, with real
worker processes on the test run's database."""

import json
import signal
import time

import pytest
from django.db import connection
from django.urls import reverse

import django_rws_jobs as rws
from django_rws_jobs.models import Worker
from django_rws_jobs.operations.worker_rows import FORGET_AFTER, Registration, forget_dead
from django_rws_jobs.operations.worker_rows import workers as live
from django_rws_jobs.queue.store import Store
from tests.test_worker import WorkerProcess, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

#: A heartbeat a second (LEASE_SECONDS / 3).
FAST = {"LEASE_SECONDS": 3, "POLL_INTERVAL": 0.2, "SHUTDOWN_TIMEOUT": 1}
T = 2_000_000_000


def test_a_registration_inserts_beats_and_removes_its_row():
    store = Store(connection)
    me = Registration("host:1:abc", ["mail", "sms"], "threads", 4, 1.0)
    me.register(store, T)
    row = Worker.objects.get()
    assert (row.id, row.queues, row.pool, row.executors, row.started_at, row.heartbeat_at) == (
        "host:1:abc",
        "mail,sms",
        "threads",
        4,
        T,
        T,
    )
    assert me.beat(store, T + 1, ["job-b", "job-a"], 10, 2, 0.004)
    row = Worker.objects.get()
    assert (row.heartbeat_at, row.running_ids(), row.done, row.failed) == (T + 1, ["job-b", "job-a"], 10, 2)
    assert row.claim_p99 == 0.004
    assert [w.id for w in live(now=T + 4)] == ["host:1:abc"]  # 3 intervals: alive
    assert live(now=T + 5) == []  # past 3 intervals: dead, left out
    Worker.objects.all().delete()  # gone while it lives: the next beat registers it again
    assert not me.beat(store, T + 2, [], 11, 2)
    row = Worker.objects.get()
    assert (row.started_at, row.heartbeat_at, row.done) == (T, T + 2, 11)  # its start is kept
    me.remove(store)
    assert not Worker.objects.exists()


def test_a_dead_workers_row_is_forgotten_an_hour_after_its_last_heartbeat():
    store = Store(connection)
    Registration("old:1:a", None, "threads", 1, 1.0).register(store, T)
    Registration("new:1:b", None, "threads", 1, 1.0).register(store, T + 10)
    assert forget_dead(store, T + FORGET_AFTER) == 0
    assert forget_dead(store, T + FORGET_AFTER + 1) == 1
    assert list(Worker.objects.values_list("id", flat=True)) == ["new:1:b"]


def test_the_workers_page_shows_each_worker_its_state_and_its_jobs(admin_client):
    store = Store(connection)
    now = int(time.time())
    Registration("web-1:7:live", ["mail"], "processes", 2, 1.0).register(store, now)
    Registration("web-2:8:gone", None, "threads", 4, 1.0).register(store, now - 60)
    job_id = rws.enqueue("test.record", "x")
    Registration("web-1:7:live", ["mail"], "processes", 2, 1.0).beat(store, now, [job_id], 5, 1, 0.0123)
    page = admin_client.get(reverse("admin:django_rws_jobs_worker_changelist")).content.decode()
    # Its claims' p99; the other's none yet.
    assert '<td class="field-claims_p99">12.3 ms</td>' in page
    assert '<td class="field-claims_p99">-</td>' in page
    assert "web-1:7:live" in page and "web-2:8:gone" in page
    assert page.count('class="rws-bad"') == 1 and ">dead<" in page  # the one without a heartbeat for 60 s
    assert reverse("admin:django_rws_jobs_job_change", args=[job_id]) in page
    assert "2 processes" in page and "(all)" in page
    assert (
        reverse("admin:django_rws_jobs_worker_changelist")
        in admin_client.get(reverse("admin:django_rws_jobs_job_changelist")).content.decode()
    )


def ids_of_live():
    return sorted(w.id for w in rws.workers())


@pytest.mark.slow
def test_workers_register_beat_and_leave(tmp_path, started):
    """Two workers appear within a heartbeat with their queues and the job each holds; SIGTERM
    removes a row; after kill -9 the row shows dead after three intervals; a row deleted while
    its worker lives comes back."""
    a = WorkerProcess(tmp_path, "--workers", "2", "--queues", "slow-a", jobs=FAST)
    b = WorkerProcess(tmp_path, "--workers", "3", "--queues", "slow-b,other", jobs=FAST)
    started += [a, b]
    a.started()
    b.started()
    wait_for(lambda: len(rws.workers()) == 2, 5, what="two registered workers")
    rows = {w.queues: w for w in rws.workers()}
    assert set(rows) == {"slow-a", "slow-b,other"}
    assert (rows["slow-a"].executors, rows["slow-b,other"].executors) == (2, 3)
    assert {w.pid for w in rows.values()} == {a.proc.pid, b.proc.pid}
    job_a = rws.enqueue("test.sleep", "30", queue="slow-a")
    job_b = rws.enqueue("test.sleep", "30", queue="slow-b")

    def holding():
        return {w.queues: w.running_ids() for w in rws.workers()}

    wait_for(lambda: holding() == {"slow-a": [job_a], "slow-b,other": [job_b]}, 5, what=f"holds: {holding()}")

    a.signal(signal.SIGTERM)  # the sleep is cut short by SHUTDOWN_TIMEOUT: handed back, row removed
    assert a.wait(60) == 0, a.output()
    assert [w.queues for w in Worker.objects.all()] == ["slow-b,other"]

    Worker.objects.all().delete()  # an operator's DELETE, or another worker's after a long pause
    wait_for(lambda: [w.queues for w in rws.workers()] == ["slow-b,other"], 5, what="the row to come back")
    assert "registered again" in b.output()

    b.signal(signal.SIGKILL)
    b.proc.wait()
    killed = time.monotonic()
    assert [w.queues for w in rws.workers()] == ["slow-b,other"]  # not yet: within 3 intervals
    wait_for(lambda: rws.workers() == [], 10, what="the killed worker to show dead")
    assert time.monotonic() - killed >= 1.5  # dead only after its heartbeats stopped for a while
    row = Worker.objects.get()  # still listed, dead, until an hour has passed
    assert json.loads(row.running) == [job_b]


def test_claims_99th_percentile_is_of_those_since_the_last_look():
    from django_rws_jobs.worker.shared import CLAIMS_KEPT, Stats

    stats = Stats()
    assert stats.claim_p99() is None
    for ms in range(1, 201):  # 1 to 200 ms
        stats.claimed(ms / 1000)
    assert stats.claim_p99() == 0.199
    assert stats.claim_p99() is None  # taken
    for _ in range(CLAIMS_KEPT + 5):
        stats.claimed(0.001)
    stats.claimed(9.0)
    assert len(stats.claims) == CLAIMS_KEPT and stats.claim_p99() == 0.001


def test_a_live_worker_reports_its_claims_99th_percentile(tmp_path, started, admin_client):
    """In its row at each heartbeat, on the metrics endpoint, and to rws_health --max-claim-p99."""
    import io

    from django.core.management import call_command
    from prometheus_client import parser

    w = WorkerProcess(tmp_path, "--workers", "2", jobs=FAST)
    started.append(w)
    w.started()
    for i in range(20):
        rws.enqueue("test.record", str(i))

    def reported():
        return [row.claim_p99 for row in Worker.objects.all() if row.claim_p99 is not None]

    wait_for(lambda: reported(), 10, what="a heartbeat with the claims' 99th percentile")
    (p99,) = reported()
    assert 0 < p99 < 5
    response = admin_client.get("/rws/metrics")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in parser.text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }
    (worker_id,) = Worker.objects.values_list("id", flat=True)
    assert samples[("rws_worker_claim_p99_seconds", (("worker", worker_id),))] > 0

    def health(limit):
        out = io.StringIO()
        try:
            call_command("rws_health", "--max-claim-p99", limit, stdout=out)
            return 0, out.getvalue()
        except SystemExit as exc:
            return exc.code, out.getvalue()

    code, line = health("60")
    assert code == 0 and "at the 99th percentile" in line, line
    code, line = health("0")
    assert code == 1 and "over --max-claim-p99 0" in line, line
