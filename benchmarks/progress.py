"""The cost of progress(): a handler that reports each row beside the same handler without it.

    scripts/bench progress [db ...] [--jobs 1000] [--rows 1000] [--repeat 3]

Each job loops over --rows rows, a little work each (a row made into JSON); `bench.rows_progress`
also calls `current_job().progress(i, rows)` for each row. N jobs of each are drained by one
`rws_worker --workers 4`, alternating, --repeat times; the medians are printed, and the share of
the drain that reports (goal >= 90%). Also the cost of one progress() call, measured in this
process on a JobContext that writes nothing (ns).
"""

from __future__ import annotations

import argparse
import json
import statistics
import timeit

from batches import clear, run_worker
from run import per_database, reset_database, setup_django


def drain(db: str, job_type: str, n: int, rows: int) -> float:
    import django_rws_jobs as rws

    clear()
    ids = sorted(rws.enqueue_many([(job_type, str(rows))] * n))
    return n / run_worker(db, ids[0], ids[-1], n, 4, job_type)


def call_ns() -> float:
    """One progress() call, on a context whose reports are dropped (the writer never wakes)."""
    from django_rws_jobs.database.backends.claimed import Claimed
    from django_rws_jobs.running.context import JobContext

    job = JobContext(Claimed.stand_in("x"), "default")
    job._queued = True  # as after the first report: later ones only replace it
    number = 200_000
    seconds = min(timeit.repeat(lambda: job.progress(5, 10), number=number, repeat=5))
    return seconds / number * 1e9


def child(db: str, args: argparse.Namespace) -> dict:
    setup_django(db)
    reset_database(db)
    out: dict[str, list] = {"plain": [], "progress": []}
    for _ in range(args.repeat):
        out["plain"].append(drain(db, "bench.rows", args.jobs, args.rows))
        out["progress"].append(drain(db, "bench.rows_progress", args.jobs, args.rows))
    out["call_ns"] = call_ns()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dbs", nargs="*", default=["sqlite", "postgres", "mysql"])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--db-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.db_child:
        print(json.dumps(child(args.db_child, args)))
        return
    print(
        "| database | plain (jobs/s) | with progress() (jobs/s) | share | one progress() call "
        "| rounds, plain vs progress |\n"
        "|---|---|---|---|---|---|"
    )
    for db, r in per_database(__file__, args, ["jobs", "rows", "repeat"]):
        plain, progress = statistics.median(r["plain"]), statistics.median(r["progress"])
        share = statistics.median(p / q for q, p in zip(r["plain"], r["progress"], strict=True))
        rounds = " / ".join(f"{q:,.0f} vs {p:,.0f}" for q, p in zip(r["plain"], r["progress"], strict=True))
        print(
            f"| {db} | {plain:,.0f} | {progress:,.0f} | {share:.0%} | {r['call_ns']:.0f} ns | {rounds} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
