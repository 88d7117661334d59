"""What enqueueing once per burst costs (issue 57): a replace, a throttled enqueue and a skipped
unique one beside a plain enqueue, and the instructions of a plain enqueue (valgrind).

    scripts/bench enqueue_once [db ...] [--calls 500] [--repeat 3]
    scripts/bench enqueue_once sqlite --instructions [--calls 300]

Timing: in one process, --calls enqueues of each kind, one call per transaction (autocommit):
plain (no key), a replace of one of 10 waiting jobs (the first 10 store them), a throttled
enqueue inside an open window (stores nothing), a unique enqueue whose key is taken (stores
nothing); the kinds alternate --repeat times; medians of wall and CPU time per call.

--instructions: a child process enqueues N and then 3N plain jobs under
``valgrind --tool=callgrind``; (the 3N count - the N count) / 2N is a plain enqueue's instructions,
which do not move with the machine: run it in a worktree of each commit to compare two versions.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

from run import ROOT, env_for, per_database, reset_database, setup_django

KINDS = ("plain", "replace", "throttled", "skipped")

ENQUEUE = (
    "import django; django.setup()\n"
    "import django_rws_jobs as rws\n"
    "for i in range({n}):\n"
    "    rws.enqueue('bench.noop', str(i))\n"
)


def one(kind: str, calls: int, round_: int) -> tuple[float, float]:
    """Seconds of wall and CPU time per call of ``calls`` enqueues of ``kind``."""
    import django_rws_jobs as rws

    def call(i: int) -> object:
        if kind == "plain":
            return rws.enqueue("bench.noop", str(i))
        if kind == "replace":
            return rws.enqueue(
                "bench.noop", str(i), unique=f"r{round_}-{i % 10}", on_conflict="replace", run_in=3600
            )
        if kind == "throttled":
            return rws.enqueue("bench.noop", str(i), unique=f"t{round_}", unique_for=3600)
        return rws.enqueue("bench.noop", str(i), unique=f"s{round_}", run_in=3600)

    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(calls):
        call(i)
    return (time.perf_counter() - wall) / calls, (time.process_time() - cpu) / calls


def child(db: str, args: argparse.Namespace) -> dict:
    setup_django(db)
    reset_database(db)
    from django_rws_jobs.models import Job, UniqueWindow

    one("plain", 50, -1)  # warm-up
    out: dict[str, list] = {k: [] for k in KINDS}
    for r in range(args.repeat):
        for kind in KINDS:
            out[kind].append(one(kind, args.calls, r))
        Job.objects.all().delete()
        UniqueWindow.objects.all().delete()
    return out


def instructions(db: str, n: int) -> int:
    """A plain enqueue's instructions: (count of 3n enqueues - count of n) / 2n."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (scripts/bench installs it)")
    counts = []
    for size in (n, 3 * n):
        out = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--callgrind-out-file=/dev/null",
                sys.executable,
                "-c",
                ENQUEUE.format(n=size),
            ],
            cwd=ROOT,
            env=env_for(db, RWS_BENCH_DB_NAME=os.environ.get("RWS_BENCH_DB_NAME", "rws_bench_enqueue_once")),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            check=True,
        )
        counts.append(int(re.search(r"Collected : (\d+)", out.stderr).group(1)))  # type: ignore[union-attr]
    return (counts[1] - counts[0]) // (2 * n)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dbs", nargs="*", default=["sqlite", "postgres", "mysql"])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--instructions", action="store_true")
    parser.add_argument("--db-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.db_child:
        print(json.dumps(child(args.db_child, args)))
        return
    if args.instructions:
        for db in args.dbs:
            os.environ["RWS_BENCH_DB_NAME"] = os.environ.get("RWS_BENCH_DB_NAME", "rws_bench_enqueue_once")
            setup_django(db)
            reset_database(db)
            print(f"{db}: {instructions(db, args.calls):,} instructions per plain enqueue", flush=True)
        return
    print(
        "| database | plain: wall / CPU per call (µs) | replace | throttled (nothing stored) "
        "| unique, skipped | replace / plain (wall) |\n|---|---|---|---|---|---|"
    )
    for db, r in per_database(__file__, args, ["calls", "repeat"], "rws_bench_enqueue_once"):
        med = {k: [statistics.median(x[i] for x in r[k]) * 1e6 for i in (0, 1)] for k in KINDS}
        cells = " | ".join(f"{med[k][0]:.0f} / {med[k][1]:.0f}" for k in KINDS)
        print(f"| {db} | {cells} | {med['replace'][0] / med['plain'][0]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
