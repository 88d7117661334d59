"""Connections that die silently: a loopback proxy (tests/proxy.py) between a worker and its
database freezes the connections it carries, or every connection (a partition), while the test
process and a second worker reach the database directly. The worker notices within
STATEMENT_DEADLINE, reconnects and goes on (django_rws_jobs/deadline.py)."""

import dataclasses
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

import django_rws_jobs as rws
from django_rws_jobs.models import Job, TaskResultRecord
from tests.proxy import Proxy
from tests.test_worker import WorkerProcess, run_counts, wait_for
from tests.testapp.models import Run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has no connection to lose"),
]

IPTABLES = shutil.which("iptables") or "/usr/sbin/iptables"
#: The variable tests/settings.py takes the worker's port from (through PgBouncer: PgBouncer's,
#: so the proxy stands between the worker and the pooler).
PORT_VARIABLE = {
    "postgresql": "RWS_TEST_PGBOUNCER_PORT" if os.environ.get("RWS_TEST_POOLER") else "PGPORT",
    "mysql": "MYSQL_PORT",
}


@pytest.fixture
def proxy():
    p = Proxy(int(connection.settings_dict["PORT"] or {"postgresql": 5432}.get(connection.vendor, 3306)))
    yield p
    p.close()


def ProxiedWorker(tmp_path, proxy: Proxy, *args: str, jobs: dict) -> WorkerProcess:  # noqa: N802
    """A worker whose connections all go through ``proxy``."""
    port = {PORT_VARIABLE[connection.vendor]: str(proxy.port)}
    return WorkerProcess(tmp_path, *args, jobs=jobs, name="proxied", env=port)


def handler_done_with_database(proxy: Proxy, w: WorkerProcess) -> None:
    """Wait until the test.start_then_sleep handler has closed the connection that wrote its start
    trace: the row is committed before the server's answer reaches the handler through the proxy,
    and a cut in between would leave the handler waiting for it (a connection of the handler's,
    which no deadline of the worker's watches)."""
    payload = Run.objects.get(kind="start").payload
    port = int(payload.rsplit(":", 1)[1])
    wait_for(
        lambda: port not in proxy.client_ports(), 10, what=f"the handler's connection to close:\n{w.output()}"
    )


@pytest.fixture
def dropped():
    """Drop every packet of the given loopback source ports, both ways (iptables), until the end."""
    rules: list[list[str]] = []

    def drop(ports: list[int]) -> None:
        for port in ports:
            for side in ("--sport", "--dport"):
                rule = ["INPUT", "-p", "tcp", "-i", "lo", side, str(port), "-j", "DROP"]
                subprocess.run([IPTABLES, "-I", *rule], check=True)
                rules.append(rule)

    yield drop
    for rule in rules:
        subprocess.run([IPTABLES, "-D", *rule], check=False)


@pytest.mark.parametrize("how", ["frozen", "dropped"])
def test_a_worker_whose_connections_die_silently_resumes_on_new_ones(tmp_path, proxy, started, dropped, how):
    """frozen: the proxy acknowledges and never answers; dropped: no packet of the worker's open
    connections arrives (iptables on their ports). New connections work in both."""
    if how == "dropped" and (not os.path.exists(IPTABLES) or os.geteuid() != 0) and not os.environ.get("CI"):
        pytest.skip("needs iptables as root (scripts/test installs it; CI runs as root)")
    jobs = {"LEASE_SECONDS": 15, "STATEMENT_DEADLINE": 3, "POLL_INTERVAL": 0.2}
    w = ProxiedWorker(tmp_path, proxy, jobs=jobs)
    started.append(w)
    w.started()
    rws.enqueue("test.record", "before")
    # The completer opens its connection when it deletes the first job: wait for that, so that
    # every connection the worker holds is open before they are cut.
    wait_for(
        lambda: run_counts() == {"before": 1} and not Job.objects.exists(),
        30,
        what=f"the first job:\n{w.output()}",
    )
    wait_for(lambda: len(proxy.client_ports()) >= 2, 10, what=f"two connections:\n{w.output()}")
    held = rws.enqueue("test.start_then_sleep", "4")
    wait_for(lambda: Run.objects.filter(kind="start").exists(), 30, what=f"the held job:\n{w.output()}")
    handler_done_with_database(proxy, w)
    if how == "frozen":
        assert proxy.freeze() >= 2  # the dispatcher's, the completer's, the keeper's...
    else:
        ports = proxy.client_ports()
        assert len(ports) >= 2
        dropped(ports)
    frozen_at = time.monotonic()
    for i in range(20):
        rws.enqueue("test.record", f"after-{i}")
    wait_for(lambda: len(run_counts()) == 21, 60, what=f"the jobs enqueued after the freeze:\n{w.output()}")
    assert time.monotonic() - frozen_at < jobs["LEASE_SECONDS"], w.output()
    assert set(run_counts().values()) == {1}
    # The held job's lease outlives the cut: the worker renews it and records its end on new
    # connections, and nobody runs it twice (test_a_partition... has the lease run out).
    wait_for(lambda: not Job.objects.filter(id=held).exists(), 30, what=f"the held job's end:\n{w.output()}")
    assert Run.objects.filter(kind="start").count() == 1
    assert "its lease ran out" not in w.output()
    assert "taken for dead" in w.output()
    assert w.proc.poll() is None


def test_a_partition_of_three_leases_loses_nothing_and_the_worker_goes_on(tmp_path, proxy, started):
    lease = 6
    jobs = {"LEASE_SECONDS": lease, "STATEMENT_DEADLINE": 2, "POLL_INTERVAL": 0.2, "RECOVERY_INTERVAL": 1}
    cut_off = ProxiedWorker(tmp_path, proxy, "--queues", "default,mine", jobs=jobs)
    started.append(cut_off)
    cut_off.started()
    held = rws.enqueue("test.start_then_sleep", "3")
    wait_for(
        lambda: Run.objects.filter(kind="start").exists(), 30, what=f"the job to start:\n{cut_off.output()}"
    )
    handler_done_with_database(proxy, cut_off)
    proxy.partition()
    partitioned_at = time.monotonic()
    other = WorkerProcess(tmp_path, "--queues", "default", jobs=jobs)
    started.append(other)
    # The held job's lease runs out; the other worker takes it back and runs it again.
    wait_for(
        lambda: Run.objects.filter(kind="start").count() >= 2 and not Job.objects.filter(id=held).exists(),
        lease * 3 + 20,
        what=f"the held job to be run by the other worker:\n{other.output()}",
    )
    time.sleep(max(0.0, 3 * lease - (time.monotonic() - partitioned_at)))
    proxy.heal()
    healed_at = time.monotonic()
    for i in range(5):
        rws.enqueue("test.record", f"mine-{i}", queue="mine")  # only the cut-off worker serves it
    wait_for(
        lambda: len(run_counts()) == 5, lease + 30, what=f"the cut-off worker to go on:\n{cut_off.output()}"
    )
    # The bound: a connect begun just before the heal waits out connect_timeout (10 s), then
    # Retry's longest pause (5 s), then a claim; a call on a dead connection waits out the deadline.
    assert time.monotonic() - healed_at < 10 + 5 + jobs["STATEMENT_DEADLINE"] + 8, cut_off.output()
    starts = Run.objects.filter(kind="start", payload__startswith="3:")
    assert starts.count() == 2  # the cut-off worker's attempt, then the other's
    assert len({r.pid for r in starts}) == 2
    assert not Job.objects.filter(status="failed").exists()
    assert cut_off.output().count("its lease ran out") == 1  # once per job
    assert cut_off.proc.poll() is None and other.proc.poll() is None


def test_a_call_watched_from_before_its_connect_can_be_cut():
    """A worker's call on a connection not opened yet (its first, or the first after a
    reconnect) opens it inside its watch; a statement that then hangs is cut all the same.
    mysqlclient refuses fileno() to the watcher's thread while the statement runs: the socket is
    the one kept when the connection was opened (deadline.remember_socket)."""
    import threading

    from django_rws_jobs.database import deadline
    from django_rws_jobs.worker.reconnect import Connection

    opened = threading.Event()
    found: dict = {}

    def hang() -> None:
        conn = Connection(connection.alias).connection()
        watch = deadline.Watch()
        watch.start(conn, "a test's statement")  # before the connect: no socket known to it
        found.update(conn=conn, watch=watch)
        started = time.monotonic()
        try:
            with conn.cursor() as c:
                opened.set()
                c.execute("SELECT SLEEP(20)" if connection.vendor == "mysql" else "SELECT pg_sleep(20)")
            found["error"] = None
        except Exception as exc:  # noqa: BLE001  (the driver's lost connection)
            found["error"] = exc
        finally:
            found["seconds"] = time.monotonic() - started
            conn.close()

    t = threading.Thread(target=hang)
    t.start()
    assert opened.wait(30)
    time.sleep(0.5)  # the statement is under way
    assert deadline.cut(found["conn"], found["watch"]) is True
    t.join(30)
    assert found["error"] is not None and found["seconds"] < 10, found
    if connection.vendor == "postgresql":  # the server runs the sleep on until it would answer
        with connection.cursor() as c:
            c.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                "current_database() AND pid <> pg_backend_pid() AND query LIKE %s",
                ["%pg_sleep(20)%"],
            )


#: The worker's settings for the cut tests: a short lease, so that "a few leases" is short.
CUT_LEASE = 6
CUT_JOBS = {
    "LEASE_SECONDS": CUT_LEASE,
    "STATEMENT_DEADLINE": 2,
    "POLL_INTERVAL": 0.2,
    "RECOVERY_INTERVAL": 1,
    "QUEUES": {"limited": {"concurrency": 5}},
}


@dataclasses.dataclass
class Cut:
    """A transaction of the worker's that takes more than one round trip, cut after its first:
    the request that begins it, the reply to wait for (b"": any), the queue of the jobs, what to
    enqueue, the traces (kind, payload) the other worker leaves, those of a run whose outcome the
    cut lost (run again by the other worker: at least once), and the databases that send the
    transaction in one round trip (nothing to cut)."""

    request: bytes | tuple[bytes, ...]
    reply: bytes
    queue: str
    enqueue: Callable[[str], Any]
    others: tuple[tuple[str, str], ...]
    lost: tuple[tuple[str, str], ...] = ()
    one_round_trip: tuple[str, ...] = ()
    #: PostgreSQL: the request is a prepared statement (sent as EXECUTE): the cut-off worker
    #: sends statements whole, as behind a transaction pooler, so that the proxy sees its text.
    unprepared: bool = False
    #: What runs before the cut is set (a job the cut transaction then carries the outcome of).
    before: Callable[[Proxy, Any], None] | None = None
    #: The transaction exists only where the driver sends several statements per call.
    several_per_call: bool = False


def a_job(queue: str) -> None:
    rws.enqueue("test.record", "cut-me", queue=queue)


def a_batch(queue: str) -> None:
    with rws.batch(on_success=rws.call("test.record", "callback", queue=queue)) as b:
        b.enqueue("test.record", "cut-me", queue=queue)


def a_dependency(queue: str) -> None:
    first = rws.enqueue("test.record", "cut-me", queue=queue)
    rws.enqueue("test.record", "dependent", queue=queue, after=[first])


def a_task(queue: str) -> None:
    from tests.testapp.tasks import record

    record.using(queue_name=queue).enqueue("cut-me")


def a_running_job(proxy: Proxy, w: Any) -> None:
    """A job that runs for 2 s on the cut-off worker's one thread: the claim that follows it
    carries its deletion (MariaDB's DeferringCursor)."""
    rws.enqueue("test.start_then_sleep", "2")
    wait_for(lambda: Run.objects.filter(kind="start").exists(), 30, what=f"the job to start:\n{w.output()}")
    handler_done_with_database(proxy, w)


CUTS = {
    # MariaDB: the band's rows locked FOR UPDATE SKIP LOCKED, then marked (MySQLBackend.claim_band);
    # PostgreSQL's claim is one UPDATE.
    "claim": Cut(b"SKIP LOCKED", b"cut-me", "default", a_job, (("record", "cut-me"),), (), ("postgresql",)),
    # MariaDB (mysqlclient): a claim that carries the deletion of the job that just succeeded,
    # "BEGIN; DELETE ...; SELECT ... FOR UPDATE SKIP LOCKED", then the UPDATE: that outcome is lost.
    "claim with a deletion": Cut(
        b"BEGIN; DELETE FROM rws_jobs",
        b"cut-me",
        "default",
        a_job,
        (("record", "cut-me"),),
        (("start", "2:"),),
        ("postgresql",),
        before=a_running_job,
        several_per_call=True,
    ),
    # A limited queue's claim, under the lock of its rws_queues row (flow/limited_claims.py).
    "limited claim": Cut(
        b"SELECT rate_slots, rate_next FROM rws_queues", b"", "limited", a_job, (("record", "cut-me"),)
    ),
    # A batch's end: its row marked finished, then its callbacks inserted (batch_outcomes.try_finish);
    # the member ran and its outcome is written: the other worker's sweep ends the batch.
    "batch finish": Cut(
        b"UPDATE rws_batches SET state = 'finished'", b"", "default", a_batch, (("record", "callback"),)
    ),
    # What waits for a job that succeeded: the dependency's outcome written, then the job that
    # waits released (dependency_outcomes.ended; two statements, no transaction): the other worker's
    # sweep releases it.
    "dependency release": Cut(
        (b"UPDATE rws_job_dependencies", b"SET outcome = "),
        b"",
        "default",
        a_dependency,
        (("record", "dependent"),),
        unprepared=True,
    ),
    # A task's success: its row deleted, then its result inserted (tasks/outcomes.succeed_many).
    # The outcome is lost: the other worker takes the job back once its lease runs out.
    "task outcome": Cut(
        b"RETURNING id, batch_id, has_dependents, metadata",
        b"",
        "default",
        a_task,
        (),
        (("task", "cut-me"),),
        unprepared=True,
    ),
}


def traces(kind: str, payload: str) -> list[int]:
    """The pids of the processes that left the trace (its payload starts with ``payload``)."""
    return sorted(Run.objects.filter(kind=kind, payload__startswith=payload).values_list("pid", flat=True))


@pytest.mark.parametrize("cut", list(CUTS))
def test_a_worker_cut_off_inside_a_transaction_holds_nothing_past_a_lease(tmp_path, proxy, started, cut):
    """The server ends the transaction of a worker cut off between two of its round trips within
    about a lease (idle_transaction_timeout, idle_in_transaction_session_timeout: the backends'
    configure_session and ScopedCursor), so another worker does what the rows it held wait for;
    the cut-off worker goes on once the network is back. Each job ran once, but one whose outcome
    the cut lost, which ran again on the other worker."""
    case = CUTS[cut]
    if connection.vendor in case.one_round_trip:
        pytest.skip(f"one statement in one round trip on {connection.vendor}")
    if case.several_per_call and os.environ.get("RWS_TEST_MYSQL_DRIVER") == "pymysql":
        pytest.skip("PyMySQL sends one statement per call: the deletion goes alone")
    queue = case.queue
    jobs = dict(CUT_JOBS)
    if case.unprepared and connection.vendor == "postgresql":
        jobs["POOLER"] = "transaction"
    cut_off = ProxiedWorker(tmp_path, proxy, "--queues", f"{queue},mine", jobs=jobs)
    started.append(cut_off)
    cut_off.started()
    # A first job, so that the worker's connections are open and its queue's rows exist (the
    # limited claim locks its queue's row: one it has yet to insert would lock nothing).
    rws.enqueue("test.record", "first", queue=queue)
    wait_for(
        lambda: run_counts() == {"first": 1} and not Job.objects.exists(),
        30,
        what=f"the first job:\n{cut_off.output()}",
    )
    if case.before is not None:
        case.before(proxy, cut_off)
    was_cut = proxy.cut_after(case.request, case.reply)
    case.enqueue(queue)
    assert was_cut.wait(30), f"no {cut} was cut:\n{cut_off.output()}"
    other = WorkerProcess(tmp_path, "--queues", queue, jobs=CUT_JOBS)
    started.append(other)
    # The server ends the cut-off transaction after about a lease; the other worker goes on.
    wait_for(
        lambda: (
            all(len(traces(*t)) == 1 for t in case.others)
            and all(len(traces(*t)) == 2 for t in case.lost)
            and not Job.objects.exists()
        ),
        CUT_LEASE * 5 + 20,
        what=f"the other worker to go on:\n{other.output()}\n{cut_off.output()}",
    )
    for t in case.others:
        assert traces(*t) == [other.proc.pid], t
    for t in case.lost:
        assert traces(*t) == sorted([cut_off.proc.pid, other.proc.pid]), t
    proxy.heal()
    rws.enqueue("test.record", "mine", queue="mine")  # only the cut-off worker serves it
    wait_for(
        lambda: run_counts()["mine"] == 1 and not Job.objects.exists(),
        CUT_LEASE * 3 + 30,
        what=f"the cut-off worker to go on:\n{cut_off.output()}",
    )
    runs = run_counts()
    assert set(runs.values()) == {1}, runs
    assert set(runs) >= {"first", "mine"}
    if cut == "task outcome":
        assert TaskResultRecord.objects.count() == 1
    assert cut_off.proc.poll() is None and other.proc.poll() is None


def test_the_worker_bounds_only_its_own_idle_transactions(settings):
    """The bound is on the worker's own connections only, and leaves nothing behind a pooler:
    MariaDB sets it on the session at connect (not on Django's connections); PostgreSQL sets it
    with each BEGIN for that transaction (the session keeps the server's value)."""
    from django_rws_jobs.database.backends import backend_for
    from django_rws_jobs.database.connections import private_connection

    settings.RWS_JOBS = {**settings.RWS_JOBS, "LEASE_SECONDS": 45}
    conn = private_connection("default")
    try:
        if connection.vendor == "mysql":
            if not connection.mysql_is_mariadb:
                pytest.skip("MySQL has no idle_transaction_timeout (docs/howto/databases.md)")
            with conn.cursor() as c:
                c.execute("SELECT @@SESSION.idle_transaction_timeout")
                assert c.fetchone()[0] == 45
            with connection.cursor() as c:
                c.execute("SELECT @@SESSION.idle_transaction_timeout")
                assert c.fetchone()[0] == 0
        else:
            show = "SELECT current_setting('idle_in_transaction_session_timeout')"
            scoped = backend_for(conn).driver_cursor()
            scoped.execute("BEGIN")
            scoped.execute(show)
            assert scoped.fetchone() == ("45s",)
            scoped.execute("COMMIT")
            with conn.cursor() as c:
                c.execute(show)
                assert c.fetchone() == ("0",)
    finally:
        conn.close()
