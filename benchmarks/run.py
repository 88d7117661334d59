"""Benchmarks for django-rws-jobs. Run through scripts/bench (which sets up the venv and servers).

    scripts/bench                      # full sizes, every database, median of 3 runs
    scripts/bench --small              # small sizes (CI: keeps the script working, no thresholds)
    scripts/bench --db postgres --repeat 1

Workloads, per database:
  drain       N due no-op jobs with one `rws_worker --workers 4 --burst` process (jobs/s)
  drain_tasks N due no-op django.tasks `@task` tasks, drained the same way (tasks/s), and its
              share of the `@job` drain of the same run
  enqueue     enqueue() one job per transaction from one thread (jobs/s)
  bulk        enqueue_many() of M jobs in one call (jobs/s)
  latency     an idle worker picks up 100 jobs enqueued 50 ms apart: p50 / p99 (ms)
  drain_future  the drain with F not-yet-due jobs in the table (jobs/s), and its share of a plain
              drain of as many jobs run just before it
  drain_keys  the drain of K due no-op jobs while W jobs wait on one busy concurrency key (its only
              slot held by a running job), and its share of a plain drain of as many jobs run
              just before it
  rss         the worker's peak resident memory during the drain (MB)
  drain_processes  the drain with `--pool processes` (--workers children), and its share of the
              thread pool's drain run just before it
  cpu         C jobs of about 5 ms of pure Python each (jobs/s): `--workers 1`, `--workers 2`
              (threads, which share one core under the GIL) and `--pool processes --workers 2`
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def env_for(db: str, **extra: str) -> dict[str, str]:
    env = dict(
        os.environ, DJANGO_SETTINGS_MODULE="benchmarks.settings", RWS_BENCH_DB=db, PYTHONPATH=str(ROOT)
    )
    env.update(extra)
    return env


def setup_django(db: str) -> None:
    # The package's bytecode, as an install has it (pip compiles what it installs; the peers'
    # too): a worker that compiled our modules at its start would count the compiler's memory.
    compileall.compile_dir(ROOT / "django_rws_jobs", quiet=1)
    os.environ.update(env_for(db))
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def per_database(
    script: str, args: argparse.Namespace, options: list[str], db_name: str | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Run ``script --db-child <db>`` for each of ``args.dbs`` in turn, passing on the arguments
    named in ``options`` (and the database's name ``db_name``, unless RWS_BENCH_DB_NAME is set);
    yield each database with the JSON the child printed last."""
    env = dict(os.environ)
    if db_name is not None:
        env.setdefault("RWS_BENCH_DB_NAME", db_name)
    for db in args.dbs:
        argv = [sys.executable, script, "--db-child", db]
        for name in options:
            argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        done = subprocess.run(argv, cwd=HERE, stdout=subprocess.PIPE, text=True, check=True, env=env)
        yield db, json.loads(done.stdout.strip().splitlines()[-1])


def reset_database(db: str) -> None:
    from django.db import connections

    name = connections["default"].settings_dict["NAME"]
    connections.close_all()  # our own connection would keep the database from being dropped
    if db == "postgres":
        subprocess.run(
            [
                "psql",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-qc",
                f"DROP DATABASE IF EXISTS {name} WITH (FORCE)",
            ],
            check=True,
        )
        subprocess.run(
            ["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", f"CREATE DATABASE {name}"], check=True
        )
    elif db == "mysql":
        subprocess.run(
            [
                "mariadb",
                "-h",
                "127.0.0.1",
                "-uroot",
                "-e",
                f"DROP DATABASE IF EXISTS {name}; CREATE DATABASE {name} CHARACTER SET utf8mb4",
            ],
            check=True,
        )
    else:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{name}{suffix}").unlink(missing_ok=True)
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "--run-syncdb", "-v0"],
        cwd=ROOT,
        env=env_for(db),
        check=True,
    )


def clear() -> None:
    """Empty the tables between workloads, so that each starts on a clean table as the first
    does. (A DELETE would leave the last workload's 100,000 dead rows to PostgreSQL's and
    InnoDB's cleanup, which a server does within a minute, and the next workload would measure
    that instead.)"""
    from django.db import connection

    with connection.cursor() as c:
        for table in ("rws_jobs", "rws_task_results", "benchapp_pickup"):
            c.execute(f"DELETE FROM {table}" if connection.vendor == "sqlite" else f"TRUNCATE TABLE {table}")


def python_speed() -> float:
    """Seconds this machine takes for a fixed pure-Python loop: to compare figures across machines."""
    t0 = time.perf_counter()
    total = 0
    for i in range(10_000_000):
        total += i
    return time.perf_counter() - t0


#: The job_type of the no-op task's rows (benchmarks/benchapp/tasks.py).
NOOP_TASK = "django.tasks:benchmarks.benchapp.tasks.noop"


def count_jobs(job_type: str = "bench.noop") -> int:
    from django.db import connection

    with connection.cursor() as c:
        # status IN (...), not status <> 'failed': two ranges of the due index. The other form
        # read the whole table on MariaDB, a million rows in the "future" workload, inside the
        # measured time (the drain's end is confirmed by this count).
        c.execute(
            "SELECT COUNT(*) FROM rws_jobs WHERE status IN ('pending', 'running') "
            "AND job_type = %s AND next_run_at <= %s",
            [job_type, int(time.time())],
        )
        return c.fetchone()[0]


def job_state(job_id: str) -> str | None:
    """One job's status, or None once it is gone: a primary-key lookup, cheap enough to poll."""
    from django.db import connection

    with connection.cursor() as c:
        c.execute("SELECT status FROM rws_jobs WHERE id = %s", [job_id])
        row = c.fetchone()
    return row[0] if row else None


def peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


#: Seconds a drain may take before the benchmark gives up on the worker.
DRAIN_TIMEOUT = 600


def drain(
    db: str,
    n: int,
    worker_args: list[str],
    job_type: str = "bench.noop",
    payload: str = "",
    tasks: bool = False,
    stop: bool = False,
) -> tuple[float, float]:
    """Enqueue n due jobs (no-op ones by default; with ``tasks``, no-op ``@task`` tasks), run one
    burst worker; return (jobs/s, peak RSS MB).

    The clock runs from the claim of the first job to the deletion of the last. The measurer
    polls primary-key lookups only (the jobs are claimed in id order: same due time, ids
    increasing), so it adds next to no load to the database it measures; a full count
    confirms the end. With ``stop``, the worker is sent SIGTERM once the jobs are done (a burst
    worker waits for jobs that other jobs hold back).
    """
    from django_rws_jobs import enqueue_many

    if tasks:
        from benchmarks.benchapp.tasks import noop

        job_type, items = NOOP_TASK, [{"task": noop}] * n
    else:
        items = [(job_type, payload)] * n
    ids = sorted(enqueue_many(items))
    first, last = ids[0], ids[-1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "rws_worker", "--burst", *worker_args],
        cwd=ROOT,
        env=env_for(db),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    rss = 0.0

    deadline = time.monotonic() + DRAIN_TIMEOUT

    def check_alive() -> None:
        if proc.poll() is not None and count_jobs(job_type) != 0:  # look again: it may have just finished
            raise RuntimeError(
                f"worker exited with {proc.returncode} and {count_jobs(job_type)} jobs left: "
                f"{proc.stderr.read()[-2000:]}"
            )
        if time.monotonic() > deadline:  # alive but stuck (a role that dies as it starts, say)
            proc.kill()
            raise RuntimeError(
                f"the drain took over {DRAIN_TIMEOUT} s and left {count_jobs(job_type)} jobs: "
                f"{proc.communicate()[1][-2000:]}"
            )

    while job_state(first) == "pending":
        check_alive()
        time.sleep(0.001)
    t0 = time.perf_counter()
    while True:
        if job_state(last) is None and count_jobs(job_type) == 0:
            t1 = time.perf_counter()
            break
        rss = max(rss, peak_rss_mb(proc.pid))
        check_alive()
        time.sleep(0.002)
    if stop:
        proc.terminate()
    proc.wait(60)
    return n / (t1 - t0), rss


def enqueue_rate(n: int, prepared: bool = False) -> float:
    """enqueue() n times; with ``prepared`` (PostgreSQL), on a connection whose OPTIONS turn on
    Django's server-side binding and psycopg's prepared statements, which Django leaves off."""
    from django.db import connection

    from django_rws_jobs import enqueue

    options = connection.settings_dict.get("OPTIONS", {})
    if prepared:
        connection.close()
        connection.settings_dict["OPTIONS"] = {**options, "server_side_binding": True, "prepare_threshold": 5}
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            enqueue("bench.noop", "x", run_in=3600)  # not due: the drain counts only due jobs
        return n / (time.perf_counter() - t0)
    finally:
        if prepared:
            connection.close()
            connection.settings_dict["OPTIONS"] = options


def bulk_rate(m: int) -> float:
    from django_rws_jobs import enqueue_many

    items = [{"job_type": "bench.noop", "payload": "x", "run_in": 3600}] * m
    t0 = time.perf_counter()
    enqueue_many(items)
    return m / (time.perf_counter() - t0)


def latency(db: str, count: int, gap: float, worker_args: list[str]) -> tuple[float, float]:
    from benchmarks.benchapp.models import Pickup
    from django_rws_jobs import enqueue

    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "rws_worker", *worker_args],
        cwd=ROOT,
        env=env_for(db),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    committed: dict[int, float] = {}
    try:
        time.sleep(2.0)  # let it start and go idle
        for seq in range(count):
            enqueue("bench.latency", str(seq))
            committed[seq] = time.time()  # the job is visible from here on
            time.sleep(gap)
        deadline = time.monotonic() + 30
        while Pickup.objects.count() < count and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(30)
    # From the commit of the enqueue to the handler's start (a worker may start a job a hair
    # before enqueue() has returned to its caller: those count as 0).
    values = sorted(max(p.started - committed[p.seq], 0.0) * 1000 for p in Pickup.objects.all())
    if len(values) < count:
        raise RuntimeError(f"only {len(values)} of {count} latency jobs ran")
    p99 = values[min(len(values) - 1, int(round(0.99 * (len(values) - 1))))]
    return statistics.median(values), p99


def cpu_iterations(ms: float = 5.0) -> int:
    """How many iterations of the CPU job's loop take about ``ms`` milliseconds here."""
    from benchmarks.benchapp.jobs import cpu_work

    n = 100_000
    best = min(_timed(cpu_work, n) for _ in range(5))
    return max(int(n * ms / 1000 / best), 1)


def _timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def pool_workloads(
    db: str, args: argparse.Namespace, worker_args: list[str], results: dict[str, list]
) -> None:
    """The thread pool's drain and the process pool's beside it; the CPU-bound comparison."""
    results["drain_threads"].append(drain(db, args.jobs, worker_args)[0])
    clear()
    processes = [*worker_args, "--pool", "processes"]
    results["drain_processes"].append(drain(db, args.jobs, processes)[0])
    clear()
    iterations = str(cpu_iterations())
    for key, cpu_args in (
        ("cpu_threads1", ["--workers", "1"]),
        ("cpu_threads2", ["--workers", "2"]),
        ("cpu_processes2", ["--workers", "2", "--pool", "processes"]),
    ):
        results[key].append(drain(db, args.cpu_jobs, cpu_args, "bench.cpu", iterations)[0])
        clear()


def fill_future(f: int, bands: int = 0) -> None:
    """Insert f jobs due tomorrow and later, generated by the database itself; with ``bands``,
    spread over that many priorities above the due jobs' (1 to bands), else at priority 0."""
    now = int(time.time())
    columns = {
        "job_type": "'bench.future'",
        "next_run_at": f"{now + 86400} + x % 100000",
        "created_at": str(now),
    }
    if bands:
        columns["priority"] = f"1 + x % {bands}"
    insert_generated(f, "future-", columns)
    settle()


def insert_generated(n: int, id_prefix: str, columns: dict[str, str]) -> None:
    """Insert n rows into rws_jobs, generated by the database itself in one statement: ids
    ``id_prefix`` + 1..n, and each column the SQL expression given, of x (1..n; arithmetic with %
    and CASE read the same on the three databases)."""
    from django.db import connection

    head = f"INSERT INTO rws_jobs (id, {', '.join(columns)}) "
    exprs = ", ".join(columns.values())
    with connection.cursor() as c:
        if connection.vendor == "postgresql":
            c.execute(head + f"SELECT '{id_prefix}' || x, {exprs} FROM generate_series(1, {n}) AS x")
        elif connection.vendor == "mysql":
            c.execute(
                head
                + f"SELECT CONCAT('{id_prefix}', x), {exprs} FROM (SELECT seq AS x FROM seq_1_to_{n}) AS s"
            )
        else:
            c.execute(
                f"WITH RECURSIVE s(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM s WHERE x < {n}) "
                + head
                + f"SELECT '{id_prefix}' || x, {exprs} FROM s"
            )


def settle() -> None:
    """After a big insert: fresh planner statistics, and the dirty pages written back, so that
    neither runs during the measurement that follows."""
    from django.db import connection

    with connection.cursor() as c:
        if connection.vendor == "postgresql":
            # As autovacuum would soon after such an insert; done now so that it does not run
            # during the measurement. The checkpoint likewise: the insert writes about 500 MB of
            # WAL, and the checkpoint it sets off would otherwise write back during the drain.
            c.execute("VACUUM ANALYZE rws_jobs")
            c.execute("CHECKPOINT")
        elif connection.vendor == "mysql":
            c.execute("ANALYZE TABLE rws_jobs")
            c.fetchall()
            flush_innodb(c)
        else:
            c.execute("ANALYZE")


def flush_innodb(c, timeout: float = 300.0) -> None:
    """Write back the dirty pages of the future rows' insert before the drain, as PostgreSQL's
    CHECKPOINT does there: InnoDB's page cleaner would otherwise write back several hundred MB
    during the drain (at its own pace, innodb_io_capacity), and the share would measure that."""
    c.execute("SELECT @@GLOBAL.innodb_max_dirty_pages_pct")
    pct = c.fetchone()[0]
    c.execute("SET GLOBAL innodb_max_dirty_pages_pct = 0")
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            c.execute("SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_pages_dirty'")
            if int(c.fetchone()[1]) < 100:
                break
            time.sleep(0.2)
    finally:
        c.execute("SET GLOBAL innodb_max_dirty_pages_pct = %s", [pct])


def run_db(db: str, args: argparse.Namespace) -> dict:
    worker_args = ["--workers", str(args.workers), *args.worker_args.split()]
    results: dict[str, list] = {
        k: []
        for k in (
            "drain",
            "drain_tasks",
            "rss",
            "enqueue",
            "enqueue_prepared",
            "bulk",
            "latency_p50",
            "latency_p99",
            "drain_beside",
            "drain_future",
            "drain_beside_keys",
            "drain_keys",
            "drain_threads",
            "drain_processes",
            "cpu_threads1",
            "cpu_threads2",
            "cpu_processes2",
        )
    }
    for r in range(args.repeat):
        reset_database(db)
        from django.db import connections

        connections.close_all()
        if not args.only_future:
            rate, rss = drain(db, args.jobs, worker_args)
            results["drain"].append(rate)
            results["rss"].append(rss)
            clear()
            results["drain_tasks"].append(drain(db, args.jobs, worker_args, tasks=True)[0])
            clear()
        if args.only_drain:
            tasks_rate = results["drain_tasks"][-1]
            print(
                f"  {db} run {r + 1}: drain={rate:.0f} tasks={tasks_rate:.0f} rss={rss:.0f}", file=sys.stderr
            )
            continue
        if args.only_pool:
            pool_workloads(db, args, worker_args, results)
            print(
                f"  {db} run {r + 1}: " + ", ".join(f"{k}={v[-1]:.1f}" for k, v in results.items() if v),
                file=sys.stderr,
            )
            continue
        if args.only_latency:
            poll = ["--poll-interval", "0.01"] if db == "mysql" else []
            p50, p99 = latency(db, args.latency_jobs, 0.05, worker_args + poll)
            print(f"  {db} run {r + 1}: latency p50={p50:.1f} p99={p99:.1f}", file=sys.stderr)
            continue
        if args.only_keys:
            key_pair(db, args, worker_args, results)
            print(
                f"  {db} run {r + 1}: plain={results['drain_beside_keys'][-1]:.0f} "
                f"keys={results['drain_keys'][-1]:.0f}",
                file=sys.stderr,
            )
            clear()
            continue
        if args.only_future:
            future_pair(db, args, worker_args, results)
            print(
                f"  {db} run {r + 1}: plain={results['drain_beside'][-1]:.0f} "
                f"future={results['drain_future'][-1]:.0f}",
                file=sys.stderr,
            )
            continue
        results["enqueue"].append(enqueue_rate(args.enqueue))
        clear()
        if db == "postgres":
            results["enqueue_prepared"].append(enqueue_rate(args.enqueue, prepared=True))
            clear()
        results["bulk"].append(bulk_rate(args.bulk))
        clear()
        # MariaDB has no wake-up channel: its idle workers poll, here every 10 ms (PostgreSQL
        # uses LISTEN/NOTIFY, SQLite watches PRAGMA data_version; both keep the default).
        poll = ["--poll-interval", "0.01"] if db == "mysql" else []
        p50, p99 = latency(db, args.latency_jobs, 0.05, worker_args + poll)
        results["latency_p50"].append(p50)
        results["latency_p99"].append(p99)
        clear()
        future_pair(db, args, worker_args, results)
        clear()
        key_pair(db, args, worker_args, results)
        clear()
        pool_workloads(db, args, worker_args, results)
        print(
            f"  {db} run {r + 1}: " + ", ".join(f"{k}={v[-1]:.1f}" for k, v in results.items() if v),
            file=sys.stderr,
        )
    med = {k: statistics.median(v) if v else float("nan") for k, v in results.items()}
    # Each future drain against the plain drain run just before it, on the same table: this
    # machine's speed drifts within minutes (see README), and the first workload's drain runs
    # minutes before the future one.
    shares = [f / b for f, b in zip(results["drain_future"], results["drain_beside"], strict=False) if b]
    med["future_share"] = statistics.median(shares) if shares else float("nan")
    key_shares = [
        k / b for k, b in zip(results["drain_keys"], results["drain_beside_keys"], strict=False) if b
    ]
    med["keys_share"] = statistics.median(key_shares) if key_shares else float("nan")
    results["keys_share"] = key_shares
    # Each tasks drain against the @job drain of the same run, run just before it.
    task_shares = [t / b for t, b in zip(results["drain_tasks"], results["drain"], strict=False) if b]
    med["tasks_share"] = statistics.median(task_shares) if task_shares else float("nan")
    results["tasks_share"] = task_shares
    med["future_share_of_first"] = med["drain_future"] / med["drain"] if med["drain"] else float("nan")
    results["future_share"] = shares
    pool_shares = [
        p / t for p, t in zip(results["drain_processes"], results["drain_threads"], strict=False) if t
    ]
    med["processes_share"] = statistics.median(pool_shares) if pool_shares else float("nan")
    for key in ("cpu_threads2", "cpu_processes2"):
        med[f"{key}_x"] = med[key] / med["cpu_threads1"] if med["cpu_threads1"] else float("nan")
    return {"median": med, "runs": results}


def future_pair(db: str, args: argparse.Namespace, worker_args: list[str], results: dict[str, list]) -> None:
    """The plain drain of future_due jobs, then the same drain with the future jobs added."""
    results["drain_beside"].append(drain(db, args.future_due, worker_args)[0])
    clear()
    fill_future(args.future)
    results["drain_future"].append(drain(db, args.future_due, worker_args)[0])


def fill_busy_key(w: int) -> None:
    """One job running with the only slot of the key "busy" (a lease of a day: nobody recovers it)
    and w due jobs waiting for that key."""
    now = int(time.time())
    holder = {
        "job_type": "'bench.keyed'",
        "status": "'running'",
        "next_run_at": str(now),
        "created_at": str(now),
        "concurrency_key": "'busy'",
        "concurrency_limit": "1",
        "concurrency_slot": "0",
        "locked_by": "'bench:holder'",
        "locked_until": str(now + 86400),
    }
    insert_generated(1, "busy-holder-", holder)
    waiting = {
        "job_type": "'bench.keyed'",
        "status": "'waiting'",
        "next_run_at": f"{now} - x % 1000",
        "created_at": str(now),
        "concurrency_key": "'busy'",
        "concurrency_limit": "1",
    }
    insert_generated(w, "busy-", waiting)
    settle()


def key_pair(db: str, args: argparse.Namespace, worker_args: list[str], results: dict[str, list]) -> None:
    """The plain drain of key_due jobs, then the same drain with key_waiting jobs waiting on one
    busy concurrency key."""
    results["drain_beside_keys"].append(drain(db, args.key_due, worker_args)[0])
    clear()
    fill_busy_key(args.key_waiting)
    results["drain_keys"].append(drain(db, args.key_due, worker_args, stop=True)[0])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", default="sqlite,postgres,mysql")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--enqueue", type=int, default=5_000)
    parser.add_argument("--bulk", type=int, default=100_000)
    parser.add_argument("--latency-jobs", type=int, default=100)
    parser.add_argument("--future", type=int, default=1_000_000)
    parser.add_argument("--future-due", type=int, default=10_000)
    parser.add_argument("--key-waiting", type=int, default=10_000, help="jobs waiting on one busy key")
    parser.add_argument("--key-due", type=int, default=5_000, help="jobs drained beside them")
    parser.add_argument("--cpu-jobs", type=int, default=1000, help="jobs of the CPU-bound workload")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--worker-args", default="", help="extra rws_worker arguments")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--small", action="store_true", help="tiny sizes, one run (CI)")
    parser.add_argument("--only-drain", action="store_true", help="measure the plain drain only")
    parser.add_argument("--only-latency", action="store_true", help="measure the pickup latency only")
    parser.add_argument(
        "--only-pool",
        action="store_true",
        help="measure the process pool's drain and the CPU-bound jobs only",
    )
    parser.add_argument(
        "--only-future",
        action="store_true",
        help="measure the drain with future jobs, and the plain drain beside it, only",
    )
    parser.add_argument(
        "--only-keys",
        action="store_true",
        help="measure the drain beside jobs waiting on a busy concurrency key, and the plain drain "
        "beside it, only",
    )
    parser.add_argument(
        "--pgbouncer",
        action="store_true",
        help="PostgreSQL through PgBouncer in transaction mode (tests/pgbouncer.py starts it)",
    )
    parser.add_argument("--db-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.small:
        args.jobs, args.enqueue, args.bulk, args.latency_jobs = 300, 200, 2000, 10
        args.future, args.future_due, args.repeat, args.cpu_jobs = 5000, 300, 1, 100
        args.key_waiting, args.key_due = 1000, 300
    if args.db_child:
        setup_django(args.db_child)
        print(json.dumps(run_db(args.db_child, args)))
        return
    bouncer = None
    if args.pgbouncer:
        sys.path.insert(0, str(ROOT))
        from tests.pgbouncer import PgBouncer, free_port

        bouncer = PgBouncer(free_port(), 5432)
        os.environ.update(RWS_BENCH_PGPORT=str(bouncer.port), RWS_BENCH_POOLER="transaction")
    try:
        run_all(args)
    finally:
        if bouncer is not None:
            bouncer.stop()


def run_all(args: argparse.Namespace) -> None:
    speed = min(python_speed() for _ in range(3))
    out = {
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, "
        f"a 10M-iteration Python loop takes {speed:.2f} s",
        "args": {k: v for k, v in vars(args).items() if k != "db_child"},
        "results": {},
    }
    for db in args.db.split(","):
        print(f"benchmarking {db} ...", file=sys.stderr)
        child = subprocess.run(
            [sys.executable, __file__, *sys.argv[1:], "--db-child", db],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
            check=True,
        )
        out["results"][db] = json.loads(child.stdout.strip().splitlines()[-1])
        (HERE / "results" / f"{db}.json").write_text(
            json.dumps({**out, "results": {db: out["results"][db]}}, indent=2)
        )
    (HERE / "results" / "latest.json").write_text(json.dumps(out, indent=2))
    print(table(out))


def table(out: dict) -> str:
    dbs = list(out["results"])
    rows = [
        (
            f"drain {out['args']['jobs']} due no-op jobs, --workers {out['args']['workers']} (jobs/s)",
            "drain",
            "{:,.0f}",
        ),
        (
            f"drain {out['args']['jobs']} due no-op @task tasks, the same worker (tasks/s)",
            "drain_tasks",
            "{:,.0f}",
        ),
        (
            "  as a share of the @job drain of the same run (median of the runs' shares)",
            "tasks_share",
            "{:.0%}",
        ),
        ("enqueue, one transaction per job (jobs/s)", "enqueue", "{:,.0f}"),
        (
            "  the same, PostgreSQL OPTIONS server_side_binding + prepare_threshold",
            "enqueue_prepared",
            "{:,.0f}",
        ),
        (f"bulk enqueue_many of {out['args']['bulk']} jobs (jobs/s)", "bulk", "{:,.0f}"),
        ("pickup latency p50 (ms; MariaDB with --poll-interval 0.01)", "latency_p50", "{:.1f}"),
        ("pickup latency p99 (ms)", "latency_p99", "{:.1f}"),
        (
            f"drain {out['args']['future_due']} due with {out['args']['future']} future jobs (jobs/s)",
            "drain_future",
            "{:,.0f}",
        ),
        (
            "  as a share of the plain drain run just before it (median of the runs' shares)",
            "future_share",
            "{:.0%}",
        ),
        ("  as a share of the first row's drain (medians)", "future_share_of_first", "{:.0%}"),
        (
            f"drain {out['args']['key_due']} due with {out['args']['key_waiting']} waiting on one "
            "busy concurrency key (jobs/s)",
            "drain_keys",
            "{:,.0f}",
        ),
        (
            "  as a share of the plain drain run just before it (target >= 90%)",
            "keys_share",
            "{:.0%}",
        ),
        ("worker peak RSS (MB)", "rss", "{:.0f}"),
        (
            f"drain {out['args']['jobs']} due no-op jobs, the thread pool again (jobs/s)",
            "drain_threads",
            "{:,.0f}",
        ),
        ("  the same with --pool processes (jobs/s)", "drain_processes", "{:,.0f}"),
        (
            "  --pool processes as a share of the threads' drain beside it (target >= 60%)",
            "processes_share",
            "{:.0%}",
        ),
        (
            f"CPU-bound: {out['args']['cpu_jobs']} jobs of ~5 ms pure Python, --workers 1 (jobs/s)",
            "cpu_threads1",
            "{:,.1f}",
        ),
        ("  --workers 2, threads (x of --workers 1; near 1x under the GIL)", "cpu_threads2_x", "{:.2f}x"),
        ("  --workers 2 --pool processes (x of --workers 1; target >= 1.7x)", "cpu_processes2_x", "{:.2f}x"),
    ]
    lines = ["| workload | " + " | ".join(dbs) + " |", "|---|" + "---|" * len(dbs)]
    for label, key, fmt in rows:
        values = [out["results"][d]["median"].get(key, float("nan")) for d in dbs]
        lines.append(f"| {label} | " + " | ".join(fmt.format(v) if v == v else "-" for v in values) + " |")
    return "\n".join(lines) + f"\n\n{out['machine']}; median of {out['args']['repeat']} run(s)."


if __name__ == "__main__":
    main()
