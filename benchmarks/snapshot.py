"""The drain with an old snapshot held open on PostgreSQL (issue 52), beside the drain without one.

    scripts/bench snapshot                          # rounds of 30,000 jobs, 2 rounds
    scripts/bench snapshot --jobs 3000 --rounds 2   # a small run
    scripts/bench snapshot --flow 10 --rate 300     # and a steady flow of 10 minutes, each way

It starts its own PostgreSQL cluster (``initdb`` into a temporary directory with the newest
binaries of /usr/lib/postgresql/*/bin, its own port, every setting at its default, autovacuum
on): the machine's main server runs with autovacuum off, which no production server does.

Rounds: N no-op jobs enqueued with enqueue_many, drained by one ``rws_worker --burst --workers
4`` (benchmarks/run.py's drain: from the first claim to the last delete), first with nothing
else open, then with one REPEATABLE READ transaction, its snapshot taken by a SELECT before the
first held round, kept open to the end. Each round reports jobs/s and the table's dead rows
after it (``n_dead_tup``), and the ratio held/free. The table is emptied (TRUNCATE) before each
of the two series.

``--flow M``: then M minutes of a steady flow (``--rate`` jobs a second, enqueued in batches
every 0.1 s) into one worker that keeps running, first free, then with the snapshot open from
the start; the claim calls' latency p50/p99 per minute (benchmarks/timed_worker.py), the jobs
left at the end and the dead rows.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks.run import clear, count_jobs, drain, env_for  # noqa: E402

NAME = "rws_bench"
HEAD = {"free": "nothing held", "held": "a snapshot held"}


class Cluster:
    """A PostgreSQL cluster of its own, its settings the defaults, run as the postgres user."""

    def __init__(self, port: int, log_slower: float | None = None):
        self.log_slower = log_slower
        binaries = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
        if not binaries:
            raise SystemExit("no PostgreSQL binaries under /usr/lib/postgresql/*/bin")
        self.bin = Path(binaries[-1])
        self.version = self.bin.parent.name
        self.port = port
        self.dir = Path(tempfile.mkdtemp(prefix="rws-snapshot-"))
        self.data = self.dir / "data"
        self.as_root = os.geteuid() == 0  # initdb and postgres refuse to run as root
        if self.as_root:
            shutil.chown(self.dir, "postgres", "postgres")

    def _run(self, *args: str) -> None:
        command = [str(a) for a in args]
        if self.as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)

    def start(self) -> None:
        self._run(self.bin / "initdb", "-D", self.data, "-U", "postgres", "-A", "trust", "--no-sync")
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1"
        if self.log_slower is not None:
            options += f" -c log_min_duration_statement={self.log_slower:g}"
            # and their plans (auto_explain, loaded into every session)
            options += " -c session_preload_libraries=auto_explain"
            options += f" -c auto_explain.log_min_duration={self.log_slower:g}"
        self._run(self.bin / "pg_ctl", "-D", self.data, "-o", options, "-l", self.dir / "log", "-w", "start")
        self.psql(f"CREATE DATABASE {NAME}")

    def psql(self, sql: str) -> None:
        subprocess.run(
            ["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-qc", sql],
            check=True,
        )

    def stop(self) -> None:
        try:
            if self.log_slower is not None:
                shutil.copy(self.dir / "log", HERE / "results" / "snapshot-slow.log")
            self._run(self.bin / "pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def dead_rows() -> int:
    """rws_jobs' dead row versions, once the workers' statistics have reached the view."""
    from django.db import connection

    time.sleep(1.5)  # a backend sends its statistics within a second of going idle
    with connection.cursor() as c:
        c.execute("SELECT pg_stat_clear_snapshot()")
        c.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'rws_jobs'")
        row = c.fetchone()
    return int(row[0]) if row else 0


def hold_snapshot():
    """Another connection's REPEATABLE READ transaction, its snapshot taken; roll it back to end it."""
    from django.db import connection, connections

    other = connections.create_connection(connection.alias)
    with other.cursor() as c:
        c.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        c.execute("SELECT COUNT(*) FROM rws_jobs")
    return other


def end_snapshot(other) -> None:
    with other.cursor() as c:
        c.execute("ROLLBACK")
    other.close()


def empty() -> None:
    """An empty table, its statistics' counters at zero (a TRUNCATE's own reset reaches them
    only when the truncating session sends its statistics)."""
    from django.db import connection

    clear()
    with connection.cursor() as c:
        c.execute("SELECT pg_stat_reset_single_table_counters('rws_jobs'::regclass)")


def rounds(args: argparse.Namespace, held: bool) -> list[tuple[float, int]]:
    empty()
    other = hold_snapshot() if held else None
    found = []
    try:
        for i in range(args.rounds):
            rate, _ = drain("postgres", args.jobs, ["--workers", str(args.workers)])
            found.append((rate, dead_rows()))
            print(
                f"  {'held' if held else 'free'} round {i + 1}: {rate:,.0f} jobs/s, "
                f"{found[-1][1]:,} dead rows"
            )
    finally:
        if other is not None:
            end_snapshot(other)
    return found


def flow(args: argparse.Namespace, held: bool) -> dict:
    """args.flow minutes of args.rate jobs a second into one worker; claim latency per minute."""
    from django_rws_jobs import enqueue_many

    empty()
    other = hold_snapshot() if held else None
    times = Path(tempfile.mkstemp(prefix="rws-claims-")[1])
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.timed_worker", "rws_worker", "--workers", str(args.workers)],
        cwd=ROOT,
        env=env_for("postgres", RWS_BENCH_CLAIM_TIMES=str(times)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        start = time.time()
        end = start + args.flow * 60
        sent = 0
        batch = max(int(args.rate / 10), 1)
        interval = batch / args.rate
        while time.time() < end:
            tick = start + (sent / batch + 1) * interval
            enqueue_many([("bench.noop", "")] * batch)
            sent += batch
            time.sleep(max(tick - time.time(), 0))
        left = count_jobs()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"worker exited with {proc.returncode}: {err[-2000:]}")
        claims = [tuple(map(float, line.split())) for line in times.read_text().splitlines()]
    finally:
        if proc.poll() is None:
            proc.kill()
        times.unlink(missing_ok=True)
        if other is not None:
            end_snapshot(other)
    minutes = []
    for m in range(int(-(-args.flow // 1))):
        part = sorted(s for t, s in claims if start + 60 * m <= t < start + 60 * (m + 1))
        if part:
            minutes.append(
                {
                    "minute": m + 1,
                    "claims": len(part),
                    "p50_ms": 1000 * statistics.median(part),
                    "p99_ms": 1000 * part[min(int(len(part) * 0.99), len(part) - 1)],
                }
            )
    return {"sent": sent, "left": left, "dead_rows": dead_rows(), "minutes": minutes}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=30_000, help="jobs a round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--flow", type=float, default=0, help="minutes of steady flow, each way (0: none)")
    parser.add_argument("--rate", type=float, default=300, help="jobs a second of the steady flow")
    parser.add_argument("--only", choices=("free", "held"), help="run one side only (the ratio needs both)")
    parser.add_argument(
        "--log-slower",
        type=float,
        metavar="MS",
        help="the server logs statements slower than MS ms, with plans: benchmarks/results/snapshot-slow.log",
    )
    args = parser.parse_args()
    from tests.pgbouncer import free_port

    cluster = Cluster(free_port(), args.log_slower)
    cluster.start()
    try:
        os.environ["RWS_BENCH_PGPORT"] = str(cluster.port)
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "--run-syncdb", "-v", "0"],
            cwd=ROOT,
            env=env_for("postgres"),
            check=True,
        )
        os.environ.update(env_for("postgres"))
        import django

        django.setup()
        print(f"PostgreSQL {cluster.version}, its own cluster on port {cluster.port}, default settings")
        sides = [how for how in ("free", "held") if args.only in (None, how)]
        out: dict = {"postgres": cluster.version, "jobs": args.jobs}
        for how in sides:
            out[how] = rounds(args, held=how == "held") if args.rounds else []
        if args.rounds:
            print()
            heads = [f"{HEAD[how]}: jobs/s (dead rows after)" for how in sides]
            print("| round | " + " | ".join(heads) + " | ratio |")
            print("|---|" + "---|" * len(sides) + "---|")
            for i in range(args.rounds):
                cells = [f"{out[how][i][0]:,.0f} ({out[how][i][1]:,})" for how in sides]
                ratio = f"{out['held'][i][0] / out['free'][i][0]:.2f}" if len(sides) == 2 else ""
                print(f"| {i + 1} | " + " | ".join(cells) + f" | {ratio} |")
        if args.flow:
            out["flow"] = {how: flow(args, held=how == "held") for how in sides}
            print()
            print(f"Steady flow, {args.rate:g} jobs/s for {args.flow:g} min each way: claim calls' latency")
            print()
            print("| minute | " + " | ".join(f"{how}: claims, p50 / p99 ms" for how in sides) + " |")
            print("|---|" + "---|" * len(sides))
            for parts in zip(*(out["flow"][how]["minutes"] for how in sides), strict=False):
                cells = [f"{m['claims']:,}, {m['p50_ms']:.2f} / {m['p99_ms']:.2f}" for m in parts]
                print(f"| {parts[0]['minute']} | " + " | ".join(cells) + " |")
            for how in sides:
                r = out["flow"][how]
                print(
                    f"{how}: {r['sent']:,} jobs sent, {r['left']:,} left at the end, "
                    f"{r['dead_rows']:,} dead rows"
                )
        (HERE / "results" / "snapshot.json").write_text(json.dumps(out, indent=2))
    finally:
        from django.db import connections

        connections.close_all()
        cluster.stop()


if __name__ == "__main__":
    main()
