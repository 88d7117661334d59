"""How long a job of a free concurrency key waits while many other keys are busy.

    scripts/bench keys [db ...] [--busy 10000] [--jobs 10]

K keys are busy (each one's only slot held by a running job with a lease of a day, and one due job
waiting for it); one idle ``rws_worker`` runs. Then jobs of new keys (named after every busy key:
the sweep reaches them last) are enqueued one at a time, 1.5 s apart, in autocommit, and each one's
wait from the enqueue's commit to its handler's start is measured. Prints p50 and max (s) per
database. The goal: under 2 s with 10,000 busy keys.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from run import ROOT, env_for, insert_generated, reset_database, settle, setup_django


def fill_busy_keys(k: int) -> None:
    from django.db import connection

    now = int(time.time())
    # busy-100001 ... : the same width, so key order is number order.
    key = "CONCAT('busy-', 100000 + x)" if connection.vendor == "mysql" else "'busy-' || (100000 + x)"
    holder = {
        "job_type": "'bench.noop'",
        "status": "'running'",
        "next_run_at": str(now),
        "created_at": str(now),
        "concurrency_key": key,
        "concurrency_limit": "1",
        "concurrency_slot": "0",
        "locked_by": "'bench:holder'",
        "locked_until": str(now + 86400),
    }
    waiting = {
        "job_type": "'bench.noop'",
        "status": "'waiting'",
        "next_run_at": str(now),
        "created_at": str(now),
        "concurrency_key": key,
        "concurrency_limit": "1",
    }
    insert_generated(k, "holder-", holder)
    insert_generated(k, "waiting-", waiting)
    settle()


def measure(db: str, jobs: int, gap: float) -> list[float]:
    from benchmarks.benchapp.models import Pickup
    from django_rws_jobs import enqueue

    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "rws_worker", "--workers", "4"],
        cwd=ROOT,
        env=env_for(db),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    committed: dict[int, float] = {}
    try:
        time.sleep(3.0)  # let it start, sweep and go idle
        for seq in range(jobs):
            enqueue("bench.latency", str(seq), concurrency_key=f"new-{seq}")
            committed[seq] = time.time()
            time.sleep(gap)
        deadline = time.monotonic() + 300
        while Pickup.objects.count() < jobs and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(60)
    waits = [max(p.started - committed[p.seq], 0.0) for p in Pickup.objects.all()]
    if len(waits) < jobs:
        raise RuntimeError(f"only {len(waits)} of {jobs} jobs of new keys ran within 300 s")
    return waits


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dbs", nargs="*", default=["sqlite", "postgres", "mysql"])
    parser.add_argument("--busy", type=int, default=10_000, help="busy keys")
    parser.add_argument("--jobs", type=int, default=10, help="jobs of new keys measured")
    parser.add_argument("--gap", type=float, default=1.5, help="seconds between their enqueues")
    parser.add_argument("--db-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.db_child:
        setup_django(args.db_child)
        reset_database(args.db_child)
        from django.db import connections

        connections.close_all()
        fill_busy_keys(args.busy)
        waits = measure(args.db_child, args.jobs, args.gap)
        print(f"{statistics.median(waits):.3f} {max(waits):.3f}")
        return
    print("| database | busy keys | jobs of new keys | wait p50 (s) | wait max (s) |\n|---|---|---|---|---|")
    for db in args.dbs:
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--db-child",
                db,
                "--busy",
                str(args.busy),
                "--jobs",
                str(args.jobs),
                "--gap",
                str(args.gap),
            ],
            cwd=ROOT / "benchmarks",
            stdout=subprocess.PIPE,
            text=True,
            check=True,
        )
        p50, worst = child.stdout.split()[-2:]
        print(f"| {db} | {args.busy:,} | {args.jobs} | {p50} | {worst} |", flush=True)


if __name__ == "__main__":
    main()
