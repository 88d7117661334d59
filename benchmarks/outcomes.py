"""What a snooze costs beside a failed attempt (issue 55: "about what a failed attempt does").

    scripts/bench outcomes [db ...] [--jobs 500] [--repeat 3]

In one process, --jobs jobs of `bench.snooze` (raises Snooze(3600)) and as many of `bench.fail`
(raises ValueError; BACKOFF_INITIAL 3600, so none comes back during the round) are each run by
tick(), one claim and one outcome write per job, the two kinds alternating --repeat times. Prints
the medians of the wall time and CPU time per outcome, and snooze / failure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from run import per_database, reset_database, setup_django


def round_of(job_type: str, n: int) -> tuple[float, float]:
    """Seconds of wall and CPU time per job to run ``n`` jobs of ``job_type`` by tick()."""
    import django_rws_jobs as rws
    from django_rws_jobs.models import Job

    Job.objects.all().delete()
    rws.enqueue_many([(job_type, str(i)) for i in range(n)])
    wall, cpu = time.perf_counter(), time.process_time()
    ran = 0
    while rws.tick():
        ran += 1
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert ran == n, f"{job_type}: {ran} of {n} ran"
    return wall / n, cpu / n


def child(db: str, args: argparse.Namespace) -> dict:
    setup_django(db)
    reset_database(db)
    import logging

    from django.test import override_settings

    logging.getLogger("django_rws_jobs").setLevel(logging.CRITICAL)  # a failure's log line per job
    out: dict[str, list] = {"snooze": [], "fail": []}
    with override_settings(RWS_JOBS={"BACKOFF_INITIAL": 3600, "MAX_RETRIES": 5}):
        round_of("bench.noop", 50)  # warm-up: connections, caches
        for _ in range(args.repeat):
            out["snooze"].append(round_of("bench.snooze", args.jobs))
            out["fail"].append(round_of("bench.fail", args.jobs))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dbs", nargs="*", default=["sqlite", "postgres", "mysql"])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--db-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.db_child:
        print(json.dumps(child(args.db_child, args)))
        return
    print(
        "| database | snooze: wall / CPU per job (ms) | failed attempt: wall / CPU per job (ms) "
        "| snooze / failure (wall, CPU) |\n|---|---|---|---|"
    )
    for db, r in per_database(__file__, args, ["jobs", "repeat"], "rws_bench_outcomes"):
        snooze = [statistics.median(x[i] for x in r["snooze"]) for i in (0, 1)]
        fail = [statistics.median(x[i] for x in r["fail"]) for i in (0, 1)]
        print(
            f"| {db} | {snooze[0] * 1e3:.2f} / {snooze[1] * 1e3:.2f} "
            f"| {fail[0] * 1e3:.2f} / {fail[1] * 1e3:.2f} "
            f"| {snooze[0] / fail[0]:.2f}, {snooze[1] / fail[1]:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
