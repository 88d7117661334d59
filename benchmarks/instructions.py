"""The worker's CPU instructions per job in a drain, counted by valgrind: a figure that does not
move with the machine's speed or its other tenants.

    scripts/bench instructions [sqlite|postgres|mysql] [--jobs N] [--workers W]

Drains N and then 3N due no-op jobs with `rws_worker --burst --workers W` (4 by default), each in
a child process run under `valgrind --tool=callgrind`, and reports (instructions of the 3N drain -
those of the N drain) / 2N: the start-up's cost cancels out. The jobs are enqueued by this
process, outside the count. On SQLite the database's own work is in the figure (SQLite runs in
the worker's process); on PostgreSQL and MariaDB only the worker's side is. valgrind runs the
threads one at a time, so claim sizes differ from a real drain and follow the thread scheduling
(runs of the same code spread by 10-20%); `--workers 1` makes every claim one job, and the count
repeatable to a fraction of a percent. Work done by the clock (lease renewal, recovery and the
pruning of task results, each every so many seconds) would count as work per job, since valgrind
makes the larger drain last minutes longer: the drains run with a lease of two hours and recovery
every hour, so none of it falls between start and end. Compare two versions of the code by it,
not two machines. `--middleware dotted.path` (repeatable) runs the drains with that middleware
(`RWS_JOBS["MIDDLEWARE"]`): its cost per job. `--tasks` drains no-op `@task` tasks
(benchmarks/benchapp/tasks.py, enqueued one call each) instead of jobs: a task's cost.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

DRAIN = (
    "import django; django.setup()\n"
    "from django.core.management import call_command\n"
    "call_command('rws_worker', burst=True, workers={workers}, verbosity=0)\n"
)


#: RWS_JOBS for the drains: no lease renewal and no recovery round within a drain.
CLOCK_FREE = {"POLL_INTERVAL": 0.5, "LEASE_SECONDS": 7200, "RECOVERY_INTERVAL": 3600}


def instructions(
    db: str, n: int, workers: int = 4, middleware: list[str] | None = None, tasks: bool = False
) -> int:
    from benchmarks.benchapp.tasks import noop
    from benchmarks.run import clear, env_for
    from django_rws_jobs import enqueue_many

    clear()
    if tasks:
        for _ in range(n):
            noop.enqueue()
    else:
        enqueue_many([("bench.noop", "")] * n)
    from django.db import connections

    connections.close_all()
    valgrind = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    out = subprocess.run(
        [*valgrind, sys.executable, "-c", DRAIN.format(workers=workers)],
        cwd=ROOT,
        env=env_for(db, RWS_BENCH_JOBS=json.dumps({**CLOCK_FREE, "MIDDLEWARE": middleware or []})),
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.search(r"Collected : ([\d,]+)", out.stderr)
    if found is None:
        raise RuntimeError(f"valgrind printed no count: {out.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("db", nargs="?", default="sqlite", choices=["sqlite", "postgres", "mysql"])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument(
        "--middleware",
        action="append",
        default=[],
        help="a dotted path for RWS_JOBS['MIDDLEWARE'] (repeatable)",
    )
    parser.add_argument("--tasks", action="store_true", help="no-op @task tasks instead of jobs")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (Debian: apt-get install valgrind)")
    sys.path.insert(0, str(ROOT))
    from benchmarks.run import reset_database, setup_django

    setup_django(args.db)
    reset_database(args.db)
    small = instructions(args.db, args.jobs, args.workers, args.middleware, args.tasks)
    large = instructions(args.db, 3 * args.jobs, args.workers, args.middleware, args.tasks)
    print(
        f"{args.db}, --workers {args.workers}: {(large - small) / (2 * args.jobs):,.0f} instructions "
        f"per {'task' if args.tasks else 'job'} in the worker "
        f"({small:,} for {args.jobs} jobs, {large:,} for {3 * args.jobs})"
    )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
