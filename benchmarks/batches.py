"""Batches and dependencies beside plain jobs, side by side in one run, per database.

    scripts/bench batches [db ...] [--jobs 10000] [--enqueue 100000] [--chain 200] [--repeat 3]

  drain    N no-op jobs, then N no-op members of one sealed batch, each drained by one
           `rws_worker --workers 4` (jobs/s); the batch's share of the plain drain. Goal >= 90%.
  enqueue  enqueue_many() of M jobs, then `b.enqueue_many()` of M members inside a batch
           (jobs/s); the batch's share. Goal >= 70%.
  chain    C no-op jobs, each enqueued after the one before, run by `rws_worker --workers 1`,
           beside C independent jobs run by the same worker one at a time (s); the chain's time
           over the plain one's. Goal <= 2.
Each pair alternates plain and batch, --repeat times; the medians are printed. Tables are emptied
between workloads. The worker runs until the jobs are gone and is then stopped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from run import ROOT, count_jobs, env_for, job_state, per_database, reset_database, setup_django


def clear() -> None:
    from django.db import connection

    with connection.cursor() as c:
        for table in ("rws_jobs", "rws_batches", "rws_batch_members", "rws_job_dependencies"):
            c.execute(f"DELETE FROM {table}" if connection.vendor == "sqlite" else f"TRUNCATE TABLE {table}")


def run_worker(db: str, first: str, last: str, n: int, workers: int, job_type: str = "bench.noop") -> float:
    """Start a worker on jobs already enqueued; seconds from the claim of ``first`` until every
    ``job_type`` job is gone (``last`` deleted and the count zero); then stop it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "rws_worker", "--workers", str(workers)],
        cwd=ROOT,
        env=env_for(db),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 600
        while job_state(first) in ("pending", "blocked"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"worker exited or stuck: {proc.stderr.read()[-2000:] if proc.stderr else ''}"
                )
            time.sleep(0.001)
        t0 = time.perf_counter()
        while not (job_state(last) is None and count_jobs(job_type) == 0 and blocked() == 0):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{count_jobs(job_type)} jobs left: worker exited or stuck")
            time.sleep(0.002)
        return time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait(60)


def blocked() -> int:
    from django.db import connection

    with connection.cursor() as c:
        c.execute("SELECT COUNT(*) FROM rws_jobs WHERE status = 'blocked'")
        return int(c.fetchone()[0])


def drain_pair(db: str, n: int) -> tuple[float, float]:
    """(plain jobs/s, batch members/s)."""
    import django_rws_jobs as rws

    clear()
    ids = sorted(rws.enqueue_many([("bench.noop", "")] * n))
    plain = n / run_worker(db, ids[0], ids[-1], n, 4)
    clear()
    with rws.batch() as b:
        ids = sorted(b.enqueue_many([("bench.noop", "")] * n))
    batch = n / run_worker(db, ids[0], ids[-1], n, 4)
    assert rws.get_batch(b.id).state == "finished"
    return plain, batch


def enqueue_pair(m: int) -> tuple[float, float]:
    """(enqueue_many jobs/s, b.enqueue_many members/s)."""
    import django_rws_jobs as rws

    clear()
    t0 = time.perf_counter()
    rws.enqueue_many(("bench.noop", "") for _ in range(m))
    plain = m / (time.perf_counter() - t0)
    clear()
    t0 = time.perf_counter()
    with rws.batch() as b:
        b.enqueue_many(("bench.noop", "") for _ in range(m))
    batch = m / (time.perf_counter() - t0)
    return plain, batch


def chain_pair(db: str, c: int) -> tuple[float, float]:
    """(seconds for C independent jobs, seconds for a chain of C), one worker thread."""
    import django_rws_jobs as rws

    clear()
    ids = sorted(rws.enqueue_many([("bench.noop", "")] * c))
    plain = run_worker(db, ids[0], ids[-1], c, 1)
    clear()
    first = previous = rws.enqueue("bench.noop", "")
    for _ in range(c - 1):
        previous = rws.enqueue("bench.noop", "", after=[previous])
    chain = run_worker(db, first, previous, c, 1)
    return plain, chain


def child(db: str, args: argparse.Namespace) -> dict:
    setup_django(db)
    reset_database(db)
    out: dict[str, list] = {"drain": [], "enqueue": [], "chain": []}
    for _ in range(args.repeat):
        out["drain"].append(drain_pair(db, args.jobs))
        out["enqueue"].append(enqueue_pair(args.enqueue))
        out["chain"].append(chain_pair(db, args.chain))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dbs", nargs="*", default=["sqlite", "postgres", "mysql"])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--enqueue", type=int, default=100_000)
    parser.add_argument("--chain", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--small", action="store_true", help="small sizes, one round (CI)")
    parser.add_argument("--db-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.small:
        args.jobs, args.enqueue, args.chain, args.repeat = 300, 2000, 20, 1
    if args.db_child:
        print(json.dumps(child(args.db_child, args)))
        return
    print(
        "| database | drain plain / batch (jobs/s) | share | enqueue plain / batch (jobs/s) | share "
        "| 1 worker: plain / chain (s) | chain / plain |\n|---|---|---|---|---|---|---|"
    )
    for db, r in per_database(__file__, args, ["jobs", "enqueue", "chain", "repeat"]):

        def med(key: str, i: int, r: dict = r) -> float:
            return statistics.median(pair[i] for pair in r[key])

        def share(key: str, r: dict = r) -> float:
            return statistics.median(pair[1] / pair[0] for pair in r[key])

        print(
            f"| {db} | {med('drain', 0):,.0f} / {med('drain', 1):,.0f} | {share('drain'):.0%} "
            f"| {med('enqueue', 0):,.0f} / {med('enqueue', 1):,.0f} | {share('enqueue'):.0%} "
            f"| {med('chain', 0):.2f} / {med('chain', 1):.2f} | {share('chain'):.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
