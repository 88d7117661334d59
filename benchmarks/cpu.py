"""The worker's CPU time per job, and what its claims and completions look like, in one drain.

    scripts/bench cpu [sqlite|postgres|mysql] [--jobs N] [--workers W] [--repeat R]
                      [--future F [--future-bands B]] [--tasks] [--pool processes]

Runs `rws_worker --burst` in this process over N due no-op jobs (with --tasks, no-op django.tasks
`@task` tasks; with --pool processes, in child processes, whose own CPU time is not counted) and
reports the rate, the
process's CPU time (user + system) per job and each role's share of it (the dispatcher, the
executors together, the completer, the keeper), how many jobs each claim and completion carried, and
the claim's and completion's wall time. CPU time per job varies much less than the rate on a
shared machine (other tenants take cycles, not instructions), so it is the figure to compare two
versions of the hot path by, run one after the other on the same machine. On SQLite the
database's own work is in it too (SQLite runs in the worker's process).
"""

from __future__ import annotations

import argparse
import collections
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def percentile(values: list[float], p: float) -> float:
    return sorted(values)[int(p * (len(values) - 1))] if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("db", nargs="?", default="postgres", choices=["sqlite", "postgres", "mysql"])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--future", type=int, default=0, help="not-yet-due jobs in the table during the drains"
    )
    parser.add_argument(
        "--future-bands",
        type=int,
        default=0,
        help="spread the future jobs over this many priorities above the due jobs'",
    )
    parser.add_argument("--tasks", action="store_true", help="no-op @task tasks instead of @job jobs")
    parser.add_argument("--pool", default="threads", choices=["threads", "processes"])
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="TOP",
        help="profile the drain's CPU time by function (yappi, every thread): the TOP functions by "
        "their own time, and the time by where the code lives (the profiler doubles the CPU time)",
    )
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from benchmarks.run import clear, fill_future, reset_database, setup_django

    setup_django(args.db)
    from django.core.management import call_command

    from django_rws_jobs import enqueue_many
    from django_rws_jobs.queue.store import Store
    from django_rws_jobs.worker import Worker

    reset_database(args.db)
    claims: collections.Counter[int] = collections.Counter()
    completions: collections.Counter[int] = collections.Counter()
    claim_s: list[float] = []
    complete_s: list[float] = []
    claim, complete_many = Store.claim, Store.complete_many

    def timed_claim(self, *a, **k):
        t0 = time.perf_counter()
        jobs = claim(self, *a, **k)
        claim_s.append(time.perf_counter() - t0)
        claims[len(jobs)] += 1
        return jobs

    def timed_complete(self, jobs, *a, **k):
        t0 = time.perf_counter()
        done = complete_many(self, jobs, *a, **k)
        complete_s.append(time.perf_counter() - t0)
        completions[len(jobs)] += 1
        return done

    Store.claim, Store.complete_many = timed_claim, timed_complete

    # CPU time of each role's threads (executors summed), read as each thread ends.
    roles: collections.Counter[str] = collections.Counter()
    spawn = Worker._spawn

    def timed_spawn(self, name, target, *a):
        def run(*args):
            try:
                target(*args)
            finally:
                roles["rws-job-*" if name.startswith("rws-job-") else name] += time.thread_time()

        spawn(self, name, run, *a)

    Worker._spawn = timed_spawn
    if args.future:
        fill_future(args.future, args.future_bands)
    for run in range(args.repeat):
        if not args.future:
            clear()
        claims.clear(), completions.clear(), claim_s.clear(), complete_s.clear(), roles.clear()
        if args.tasks:
            from benchmarks.benchapp.tasks import noop

            enqueue_many([{"task": noop}] * args.jobs)
        else:
            enqueue_many([("bench.noop", "")] * args.jobs)
        if args.profile:
            import yappi

            yappi.clear_stats()
            yappi.set_clock_type("cpu")
            yappi.start(builtins=True)
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        call_command("rws_worker", burst=True, workers=args.workers, pool=args.pool, verbosity=0)
        t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        if args.profile:
            yappi.stop()
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        print(
            f"{args.db} run {run + 1}: {args.jobs / (t1 - t0):,.0f} jobs/s, worker CPU "
            f"{cpu / args.jobs * 1e6:.0f} us/job "
            f"(system {(r1.ru_stime - r0.ru_stime) / args.jobs * 1e6:.0f})"
        )
        by_role = ", ".join(f"{k} {v / args.jobs * 1e6:.0f}" for k, v in roles.most_common())
        print("  CPU by thread (us/job): " + by_role)
        print(
            f"  claims by size {sorted(claims.items())}; "
            f"completions by size {sorted(completions.items())[:8]}"
        )
        for label, values in (("claim", claim_s), ("completion", complete_s)):
            print(
                f"  {label}: p50 {percentile(values, 0.5) * 1e6:.0f} us, "
                f"p90 {percentile(values, 0.9) * 1e6:.0f} us, p99 {percentile(values, 0.99) * 1e6:.0f} us"
            )
        if args.profile:
            print_profile(yappi.get_func_stats(), args.jobs, args.profile)


def where(path: str) -> str:
    """Where a function's code lives: a part of the package, Django, a driver, or Python."""
    if "django_rws_jobs/" in path:
        rest = path.split("django_rws_jobs/", 1)[1]
        return "rws " + (rest.split("/", 1)[0] if "/" in rest else rest.removesuffix(".py"))
    for name in ("django", "psycopg", "MySQLdb", "pymysql", "asgiref"):
        if f"/{name}/" in path:
            return name
    if path.startswith("..") or "/" not in path:
        return "C (builtins, the drivers' C code)"
    return "Python's library"


def print_profile(stats, jobs: int, top: int) -> None:
    """The TOP functions by their own CPU time, and the own time summed by where the code lives,
    in microseconds per job."""
    rows = sorted(stats, key=lambda s: s.tsub, reverse=True)
    total = sum(s.tsub for s in rows)
    print(f"  profile: {total / jobs * 1e6:.0f} us/job of own time in all (profiled)")
    groups: collections.Counter[str] = collections.Counter()
    for s in rows:
        groups[where(s.module)] += s.tsub
    for name, t in groups.most_common():
        print(f"    {name:40} {t / jobs * 1e6:7.1f} us/job {t / total:6.1%}")
    print(f"  the {top} functions with the most own time (us/job, calls/job):")
    for s in rows[:top]:
        module = s.module.split("site-packages/")[-1].split("django_rws_jobs/")[-1]
        print(f"    {s.tsub / jobs * 1e6:7.1f} {s.ncall / jobs:6.2f}  {s.name} ({module}:{s.lineno})")


if __name__ == "__main__":
    main()
