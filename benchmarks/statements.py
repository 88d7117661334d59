"""What one claim and one completion cost on a database, statement by statement.

    scripts/bench statements [sqlite|postgres|mysql] [--jobs N] [--rounds R]

Fills the benchmark database with N due no-op jobs, then times, on the worker's own kind of
connection (private, prepared statements on PostgreSQL): claims of 1, 4 and 16 jobs, each followed
by the completion of what it took (a drain's steady state), the completion alone, and two
reference statements (`SELECT 1`, and a bare UPDATE of 4 rows by primary key). The figures say
how much of a drain's time is the database's, whatever the worker does around it. Last, one
`enqueue()` against a bare INSERT of the same row, both in autocommit: the app's share of an enqueue.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("db", nargs="?", default="postgres", choices=["sqlite", "postgres", "mysql"])
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    os.environ.update(DJANGO_SETTINGS_MODULE="benchmarks.settings", RWS_BENCH_DB=args.db)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.db import connection

    from benchmarks.run import reset_database
    from django_rws_jobs import enqueue, enqueue_many
    from django_rws_jobs.api.enqueue import INSERT_SQL, prepare
    from django_rws_jobs.database.connections import private_connection
    from django_rws_jobs.queue.store import Store

    reset_database(args.db)
    ids = sorted(enqueue_many([("bench.noop", "")] * args.jobs))
    if connection.vendor == "postgresql":
        with connection.cursor() as c:
            c.execute("VACUUM ANALYZE rws_jobs")
    claimer, completer = Store(private_connection("default")), Store(private_connection("default"))
    now = int(time.time())
    needed = args.rounds * (1 + 4 + 16 + 4) + 4 * args.rounds
    if needed > args.jobs:
        raise SystemExit(f"--jobs {args.jobs} is too few for --rounds {args.rounds}: at least {needed}")

    def timed(label: str, fn) -> None:
        t0 = time.perf_counter()
        for i in range(args.rounds):
            fn(i)
        print(f"{label:<44} {(time.perf_counter() - t0) / args.rounds * 1e6:8.0f} us")

    print(f"{args.db}: {args.rounds} rounds each, {args.jobs} due jobs at the start")
    with claimer.conn.cursor() as c:
        timed("SELECT 1", lambda i: (c.execute("SELECT 1"), c.fetchall()))
    for size in (1, 4, 16):

        def claim(i: int, size: int = size) -> None:
            jobs = claimer.claim(f"bench-{size}-{i}", now, now + 60, None, size)
            assert len(jobs) == size, jobs
            completer.complete_many(jobs)

        timed(f"claim {size} + complete them", claim)
    taken: list = []

    def claim_only(i: int) -> None:
        taken.extend(claimer.claim(f"bench-only-{i}", now, now + 60, None, 4))

    timed("claim 4 (kept running)", claim_only)
    timed("complete 4", lambda i: completer.complete_many(taken[4 * i : 4 * i + 4]))
    rest = ids[-4 * args.rounds :]  # claims go in id order: these are still pending
    marks = ", ".join(["%s"] * 4)
    with claimer.conn.cursor() as c:
        timed(
            "UPDATE of 4 rows by primary key (reference)",
            lambda i: c.execute(
                f"UPDATE rws_jobs SET attempts = attempts + 1 WHERE id IN ({marks})", rest[4 * i : 4 * i + 4]
            ),
        )
    # What one enqueue costs against a bare INSERT of the same row on the same (Django's) connection,
    # both in autocommit: the difference is the app's share, the rest is the database's commit.
    timed("enqueue() of one job, autocommit", lambda i: enqueue("bench.noop", "x", run_in=3600))
    rows = [prepare("bench.noop", "x", run_in=3600) for _ in range(args.rounds)]
    with connection.cursor() as c:
        timed("INSERT of one job, autocommit (reference)", lambda i: c.execute(INSERT_SQL, rows[i]))


if __name__ == "__main__":
    main()
