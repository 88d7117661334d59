"""Metrics: the per-minute counters (rws_metrics), their pruning into totals, and the Prometheus
endpoint, parsed as Prometheus parses it."""

import select
import threading
import time
import weakref

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import django_rws_jobs as rws
from django_rws_jobs.database.backends.claimed import Claimed
from django_rws_jobs.models import Job, MetricMinute, MetricTotal
from django_rws_jobs.operations import metrics
from django_rws_jobs.queue.store import Store
from tests.proxy import Proxy
from tests.test_worker import WorkerProcess

parser = pytest.importorskip("prometheus_client.parser")
pytestmark = pytest.mark.django_db(transaction=True)

T = 2_000_000_020  # a minute's start + 40 s
URL = "/rws/metrics"
TOKEN = "s3cret-token-for-tests"


def job(queue="default", job_type="t.x", due=T - 5):
    return Claimed("id", job_type, "", queue, 0, 0, 3, due, 0, None, None, None, None, "tok")


def scrape(client, **headers):
    response = client.get(URL, **headers)
    assert response.status_code == 200, response.content
    found = {}
    for family in parser.text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_counters_add_up_per_minute_queue_and_job_type_across_writes():
    # Events are counted in the minute of the write (take) that carries them; a run's start is
    # dated from the clock and time.monotonic() read together at that write: with both T, a run
    # that started at "monotonic" T + 1 started at T + 1.
    store = Store(connection)
    counters = metrics.Counters()
    counters.ran(job(), 0.5, T)
    counters.ran(job(), 1.5, T + 1)
    counters.ran(job("mail"), 2.0, T)
    counters.ended([job(), job(), job("mail"), job()], ["done", "dead", "retry", "lost"])
    metrics.write(store, counters.take(T, T))
    assert counters.take(T, T) == []
    counters.give_back([[T - T % 60, "mail", "t.x", 0, 0, 0, 0, 1, 1.0, 0.0, 0, 9.0]])  # a failed write's
    assert counters.take(T, T) == [[T - T % 60, "mail", "t.x", 0, 0, 0, 0, 1, 1.0, 0.0, 0, 9.0]]
    counters.ended([job()], ["done"])
    counters.ran(job(), 3.0, T + 5)
    metrics.write(store, counters.take(T + 10, T + 10))  # added to the stored minute
    counters.ended([job()], ["cancelled"])
    metrics.write(store, counters.take(T + 30, T + 30))  # the next minute
    rows = {
        (m.minute, m.queue): (
            m.done,
            m.failed,
            m.dead,
            m.cancelled,
            m.runs,
            m.run_seconds,
            m.run_seconds_max,
            m.wait_seconds,
        )
        for m in MetricMinute.objects.all()
    }
    minute = T - T % 60
    assert rows == {
        (minute, "default"): (2, 1, 1, 0, 3, 5.0, 3.0, 5 + 6 + 10),
        (minute, "mail"): (0, 1, 0, 0, 1, 2.0, 2.0, 5),
        (minute + 60, "default"): (0, 0, 0, 1, 0, 0.0, 0.0, 0),
    }


def test_the_counters_add_up_runs_and_outcomes_as_they_come():
    # The executor whose run makes FOLD_AT runs or ENDS_FOLD_AT batches of outcomes waiting adds
    # them up: a worker keeps at most about that many, and the write counts each once, wherever
    # it was added up.
    counters = metrics.Counters()
    runs = metrics.FOLD_AT + 10
    for i in range(runs):
        counters.ran(job("mail" if i % 3 == 0 else "default", due=T - 5), 0.5 if i else 2.0, T + 1)
        counters.ended([job("mail" if i % 3 == 0 else "default")], ["done" if i % 2 else "retry"])
    assert len(counters.runs) < metrics.FOLD_AT and len(counters.ends) <= metrics.ENDS_FOLD_AT
    minute = T - T % 60
    mail = len(range(0, runs, 3))
    mail_done = len([i for i in range(0, runs, 3) if i % 2])
    other_done = len([i for i in range(runs) if i % 3 and i % 2])
    assert counters.take(T, T) == [
        [
            minute,
            "default",
            "t.x",
            other_done,
            runs - mail - other_done,
            0,
            0,
            runs - mail,
            0.5 * (runs - mail),
            6.0 * (runs - mail),
            0,
            0.5,
        ],
        [
            minute,
            "mail",
            "t.x",
            mail_done,
            mail - mail_done,
            0,
            0,
            mail,
            2.0 + 0.5 * (mail - 1),
            6.0 * mail,
            0,
            2.0,
        ],
    ]
    assert counters.take(T, T) == []


def test_the_counters_keep_ended_jobs_for_few_batches_only():
    # Counters.ended keeps a batch's jobs until the executor whose run makes ENDS_FOLD_AT batches
    # waiting adds them up, not until the write: a worker would otherwise hold up to a second's
    # jobs (FLUSH_EVERY) in memory.
    counters = metrics.Counters()
    batches = [[job(), job()], [job(), job("mail")]] + [[job()] for _ in range(metrics.ENDS_FOLD_AT - 2)]
    refs = [weakref.ref(j) for b in batches for j in b]
    for i, b in enumerate(batches):
        counters.ended(b, ["done", "done"] if i == 0 else ["retry", "dead"] if i == 1 else ["done"])
    del b, batches
    assert all(r() is not None for r in refs)  # not added up yet: one call per batch, no more
    counters.ran(job(), 0.5, T)
    assert [r() for r in refs] == [None] * len(refs)
    minute = T - T % 60
    assert counters.take(T, T) == [
        [minute, "default", "t.x", metrics.ENDS_FOLD_AT, 1, 0, 0, 1, 0.5, 5.0, 0, 0.5],
        [minute, "mail", "t.x", 0, 1, 1, 0, 0, 0, 0, 0, 0],
    ]


def test_pruning_keeps_the_counters_monotonic(admin_client):
    store = Store(connection)
    counters = metrics.Counters()
    for minute in range(5):
        counters.ended([job()] * (minute + 1), ["done"] * (minute + 1))
        metrics.write(store, counters.take(T + 60 * minute, T))
    before = scrape(admin_client)[("rws_jobs_done_total", (("job_type", "t.x"), ("queue", "default")))]
    assert before == 15
    assert metrics.prune(store, T - T % 60 + 120) == 2  # the first two minutes: 1 + 2 done
    assert MetricTotal.objects.get().done == 3 and MetricMinute.objects.count() == 3
    assert metrics.prune(store, T - T % 60 + 120) == 0  # folded once, never twice
    after = scrape(admin_client)[("rws_jobs_done_total", (("job_type", "t.x"), ("queue", "default")))]
    assert after == before


def test_the_endpoint_needs_staff_or_the_token(client, admin_client, django_user_model, settings):
    assert client.get(URL).status_code == 403
    django_user_model.objects.create_user("plain", password="pw")
    client.login(username="plain", password="pw")
    assert client.get(URL).status_code == 403  # logged in, not staff
    assert admin_client.get(URL).status_code == 200
    settings.RWS_JOBS = {**settings.RWS_JOBS, "METRICS_TOKEN": TOKEN}
    anonymous = client.__class__()
    assert anonymous.get(URL, HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    assert anonymous.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200


def test_the_token_scheme_is_case_insensitive(client, settings):
    # RFC 7235: the auth scheme is a case-insensitive token, followed by one or more spaces.
    settings.RWS_JOBS = {**settings.RWS_JOBS, "METRICS_TOKEN": TOKEN}
    for given in (f"bearer {TOKEN}", f"BEARER {TOKEN}", f"beArer  {TOKEN}"):
        assert client.get(URL, HTTP_AUTHORIZATION=given).status_code == 200, given
    for given in (f"bearer{TOKEN}", f"Basic {TOKEN}", "bearer", "bearer ", f"bearer {TOKEN}x", TOKEN):
        assert client.get(URL, HTTP_AUTHORIZATION=given).status_code == 403, given


def test_the_gauges_equal_the_tables_counts(admin_client):
    now = int(time.time())
    for i in range(3):
        rws.enqueue("test.record", str(i), queue="mail")
    rws.enqueue("test.record", "later", queue="mail", run_in=3600)
    rws.enqueue("test.keyed", "k", concurrency_key="k")  # pending: the key's slot was free
    rws.enqueue("test.keyed", "k2", concurrency_key="k")  # waiting
    failed = rws.enqueue("test.record", "f")
    Job.objects.filter(id=failed).update(status="failed")
    Job.objects.filter(payload="0").update(next_run_at=now - 100)
    rws.pause_queue("mail")
    found = scrape(admin_client)

    def gauge(queue, state):
        return found[("rws_queue_jobs", (("queue", queue), ("state", state)))]

    assert (gauge("mail", "pending"), gauge("mail", "due"), gauge("mail", "failed")) == (4, 3, 0)
    assert (gauge("default", "waiting"), gauge("default", "failed"), gauge("default", "running")) == (1, 1, 0)
    assert found[("rws_queue_paused", (("queue", "mail"),))] == 1
    assert found[("rws_queue_paused", (("queue", "default"),))] == 0
    assert found[("rws_queue_oldest_due_age_seconds", (("queue", "mail"),))] >= 100
    assert found[("rws_workers_alive", ())] == 0


def test_blocked_jobs_and_batches_in_the_gauges(admin_client):
    from django_rws_jobs.models import BatchRecord

    first = rws.enqueue("test.record", "first", run_in=3600)
    rws.enqueue("test.record", "after", after=[first])
    with rws.batch() as finished:
        pass
    with rws.batch() as sealed:
        sealed.enqueue("test.record", "m", run_in=3600)
    with rws.batch() as still_open:
        BatchRecord.objects.filter(id=still_open.id).update(created_at=int(time.time()) - 300)
        found = scrape(admin_client)
    assert found[("rws_queue_jobs", (("queue", "default"), ("state", "blocked")))] == 1
    states = {s: found[("rws_batches", (("state", s),))] for s in ("open", "sealed", "finished", "cancelled")}
    assert states == {"open": 1, "sealed": 1, "finished": 1, "cancelled": 0}
    assert found[("rws_batch_oldest_open_age_seconds", ())] >= 300
    assert finished.id != sealed.id


def test_a_waiting_job_whose_key_stays_full_is_due_in_the_gauges(admin_client):
    from tests.test_health import stall_a_key

    stall_a_key(due_ago=100)
    found = scrape(admin_client)
    assert found[("rws_queue_jobs", (("queue", "default"), ("state", "waiting")))] == 1
    assert found[("rws_queue_jobs", (("queue", "default"), ("state", "due")))] == 1
    assert found[("rws_queue_oldest_due_age_seconds", (("queue", "default"),))] >= 100


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite locks the whole file, never a row")
def test_a_due_job_a_transaction_keeps_locked_is_a_gauge(admin_client):
    """rws_queue_locked_due_jobs counts, per queue, the pending jobs due for over a lease that a
    transaction keeps locked (operations/metrics.locked_due), as rws_health --max-locked-due."""
    from tests.test_health import locked_by_another_transaction

    stuck = rws.enqueue("test.record", "stuck", queue="q1")
    rws.enqueue("test.record", "free", queue="q2")
    Job.objects.update(next_run_at=int(time.time()) - 2 * 60)
    gauge = "rws_queue_locked_due_jobs"
    found = scrape(admin_client)
    assert found[(gauge, (("queue", "q1"),))] == 0 and found[(gauge, (("queue", "q2"),))] == 0
    with locked_by_another_transaction(stuck):
        found = scrape(admin_client)
    assert found[(gauge, (("queue", "q1"),))] == 1 and found[(gauge, (("queue", "q2"),))] == 0


def test_the_endpoint_runs_the_same_statements_for_one_queue_or_twenty(admin_client):
    def statements() -> int:
        with CaptureQueriesContext(connection) as queries:
            admin_client.get(URL)
        return len(queries)

    rws.enqueue("test.record", "x")
    one = statements()
    for i in range(20):
        rws.enqueue("test.record", "x", queue=f"q{i}")
        rws.pause_queue(f"q{i}")
    assert statements() == one


@pytest.mark.slow
def test_a_workers_counters_reach_the_endpoint(tmp_path, started, admin_client):
    """A burst worker runs 5 jobs, 2 of which fail for good: its counters are written before it
    exits, and the endpoint's counters equal them."""
    for i in range(3):
        rws.enqueue("test.record", str(i))
    for i in range(2):
        rws.enqueue("test.fail", str(i), max_retries=0)
    w = WorkerProcess(tmp_path, "--burst", jobs={"POLL_INTERVAL": 0.1})
    started.append(w)
    assert w.wait(60) == 0, w.output()
    found = scrape(admin_client)
    assert found[("rws_jobs_done_total", (("job_type", "test.record"), ("queue", "default")))] == 3
    assert found[("rws_jobs_dead_total", (("job_type", "test.fail"), ("queue", "default")))] == 2
    assert found[("rws_job_attempts_failed_total", (("job_type", "test.fail"), ("queue", "default")))] == 2
    assert found[("rws_job_runs_total", (("job_type", "test.record"), ("queue", "default")))] == 3


class CommitReplyLost(Proxy):
    """tests/proxy.py's proxy, which loses the reply to the first statement that commits a write
    of the counters (the INSERT in autocommit, else the COMMIT after it): once a connection has
    sent an INSERT INTO rws_metrics, each reply it gets is held until ``committed()`` (asked on
    a connection of the test's own) says the rows are stored; that reply is dropped and the
    connection frozen, as a network that fails just then leaves it."""

    def __init__(self, target_port: int, committed):
        self.committed = committed
        self.lost = threading.Event()
        super().__init__(target_port)

    def _pump(self, client, upstream, frozen):
        ends = {client: upstream, upstream: client}
        armed = False
        try:
            while not frozen.is_set() and not self.closed.is_set():
                ready, _, _ = select.select(list(ends), [], [], 0.1)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return self._shut(client, upstream)
                    if s is client and b"INSERT INTO rws_metrics (" in data:
                        armed = not self.lost.is_set()
                    if s is upstream and armed and self.committed():
                        self.lost.set()
                        frozen.set()
                        break
                    ends[s].sendall(data)
            self.closed.wait()
        except OSError:
            self._shut(client, upstream)


def stored_done() -> int:
    """The jobs done in rws_metrics, read on a connection of the calling thread's, closed after."""
    from django.db import connections
    from django.db.models import Sum

    try:
        return MetricMinute.objects.aggregate(n=Sum("done"))["n"] or 0
    finally:
        connections.close_all()


@pytest.mark.slow
@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has no reply to lose")
def test_a_counters_write_whose_commit_reply_is_lost_counts_once(tmp_path, started):
    """The worker's write of its counters commits, the reply is lost, the statement deadline
    takes the connection for dead: the write failed as far as the worker knows, but its rows are
    stored, and writing them again would count those jobs twice."""
    from tests.test_dead_connections import PORT_VARIABLE
    from tests.test_worker import wait_for

    port = int(connection.settings_dict["PORT"] or {"postgresql": 5432}.get(connection.vendor, 3306))
    proxy = CommitReplyLost(port, lambda: stored_done() > 0)
    try:
        w = WorkerProcess(
            tmp_path,
            jobs={"STATEMENT_DEADLINE": 2, "POLL_INTERVAL": 0.2},
            name="proxied",
            env={PORT_VARIABLE[connection.vendor]: str(proxy.port)},
        )
        started.append(w)
        w.started()
        for i in range(3):
            rws.enqueue("test.record", str(i))
        wait_for(proxy.lost.is_set, 30, what=f"the lost reply:\n{w.output()}")
        wait_for(
            lambda: "could not write the metrics counters" in w.output(),
            30,
            what=f"the write to fail:\n{w.output()}",
        )
        for i in range(2):  # counted by a write after the failed one
            rws.enqueue("test.record", f"after-{i}")
        wait_for(lambda: stored_done() >= 5, 30, what=f"the later jobs' counts:\n{w.output()}")
        assert stored_done() == 5, w.output()
        assert "may be stored already" in w.output()
    finally:
        proxy.close()


def test_a_counters_write_that_did_not_commit_is_given_back_and_counted_once():
    """The other side: a write whose statement fails (here a lock wait that times out, on a
    worker's own connection) committed nothing, and its rows are counted at the next write."""
    from django.db import DatabaseError

    from django_rws_jobs.database.connections import private_connection

    writer, holder = private_connection("default"), private_connection("default")
    store = Store(writer)
    try:
        counters = metrics.Counters()
        counters.ended([job()], ["done"])
        metrics.write(store, counters.take(T, T))  # the minute's row, which the holder locks
        counters.ended([job()] * 2, ["done"] * 2)
        rows = counters.take(T, T)
        with writer.cursor() as c:
            c.execute(
                {
                    "postgresql": "SET lock_timeout = '100ms'",
                    "mysql": "SET SESSION innodb_lock_wait_timeout = 1",
                    "sqlite": "PRAGMA busy_timeout = 100",
                }[writer.vendor]
            )
        with holder.cursor() as c:
            if holder.vendor == "sqlite":
                c.execute("BEGIN IMMEDIATE")  # the file's write lock
            else:
                c.execute("BEGIN")
                c.execute("SELECT done FROM rws_metrics FOR UPDATE")
            with pytest.raises(DatabaseError):
                metrics.write(store, rows)
            c.execute("ROLLBACK")
        assert not rows.maybe_stored
        counters.give_back(rows)
        metrics.write(store, counters.take(T, T))
        assert MetricMinute.objects.get().done == 3
    finally:
        writer.close()
        holder.close()


def test_the_overview_charts_the_last_hour_and_day(admin_client):
    from django.urls import reverse

    store = Store(connection)
    now = int(time.time())
    counters = metrics.Counters()
    counters.ended([job()] * 7 + [job()] * 2, ["done"] * 7 + ["retry"] * 2)
    metrics.write(store, counters.take(now, now))
    counters.ended([job()] * 4, ["done"] * 4)
    metrics.write(store, counters.take(now - 3 * 3600, now))  # in the day's chart only
    page = admin_client.get(reverse("admin:django_rws_jobs_job_overview")).content.decode()
    assert "last hour, per minute: 7 done, 2 failed attempts" in page
    assert "last day, per 15 minutes: 11 done, 2 failed attempts" in page
    assert page.count('<rect class="rws-seg-failed"') == 2 and ": 7 done, 2 failed</title>" in page


def test_snoozes_are_counted_apart_from_failures():
    counters = metrics.Counters()
    counters.ended([job(), job(), job()], ["snoozed", "snoozed", "retry"])
    (row,) = counters.take(T, T)
    values = dict(zip((*metrics.KEYS, *metrics.ADDS, *metrics.MAXES), row, strict=True))
    assert (values["snoozed"], values["failed"], values["done"]) == (2, 1, 0)
