"""What ``current_job().iterate`` costs per item beyond the loop's own work (issue 56: "no more
than a few microseconds per item").

    scripts/bench iterate [db ...] [--rows 20000] [--numbers 200000] [--repeat 3]

In one process, a job run by tick() loops over --rows rows of a table with a body that does
nothing: once by ``QuerySet.iterator(chunk_size=500)`` (the plain loop) and once by
``iterate(queryset)`` (keyset pages of 500, progress and cursor saved); then over --numbers numbers
from a function, plainly and by ``iterate(function)``. Each pair alternates --repeat times; the
medians of the loops' CPU time give the cost per item of each, and iterate's extra per item.
"""

from __future__ import annotations

import argparse
import json
import statistics

from run import per_database, reset_database, setup_django


def one(kind: str, n: int) -> float:
    """CPU seconds per item of one loop of ``kind`` run as a job by tick()."""
    import django_rws_jobs as rws
    from benchmarks.benchapp.jobs import LOOPS

    rws.enqueue("bench.loop", f"{kind} {n}")
    assert rws.tick()
    label, seconds, items = LOOPS.pop()
    assert label == kind and items == n, (label, items, n)
    return seconds / n


def child(db: str, args: argparse.Namespace) -> dict:
    setup_django(db)
    reset_database(db)
    from benchmarks.benchapp.models import Row

    Row.objects.bulk_create([Row(n=i) for i in range(args.rows)], batch_size=2000)
    one("rows_plain", args.rows)  # warm-up: connections, caches
    out: dict[str, list[float]] = {
        k: [] for k in ("rows_plain", "rows_iterate", "numbers_plain", "numbers_iterate")
    }
    for _ in range(args.repeat):
        for kind in out:
            out[kind].append(one(kind, args.rows if kind.startswith("rows") else args.numbers))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dbs", nargs="*", default=["sqlite", "postgres", "mysql"])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--numbers", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--db-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.db_child:
        print(json.dumps(child(args.db_child, args)))
        return
    print(
        "| database | rows: plain / iterate, CPU µs per item | iterate's extra per row (µs) "
        "| numbers: plain / iterate (µs) | iterate's extra per number (µs) |\n|---|---|---|---|---|"
    )
    for db, found in per_database(__file__, args, ["rows", "numbers", "repeat"], "rws_bench_iterate"):
        r = {k: statistics.median(v) * 1e6 for k, v in found.items()}
        print(
            f"| {db} | {r['rows_plain']:.2f} / {r['rows_iterate']:.2f} "
            f"| {r['rows_iterate'] - r['rows_plain']:.2f} "
            f"| {r['numbers_plain']:.2f} / {r['numbers_iterate']:.2f} "
            f"| {r['numbers_iterate'] - r['numbers_plain']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
