"""The W1 drain beside the peers, in one run, their rounds alternating.

    scripts/bench peers [sqlite|postgres|tasks ...] [--jobs 5000] [--repeat 3] [--peers a,b]

W1: N no-op jobs enqueued one call each (each its own transaction), then one worker process
with four-way concurrency drains them. The figure is the steady drain, (N - 1) / (the last job's
start - the first's): every system's handler appends its start time to a file with one write(2)
(peerapps/stamps.py), and nothing else. Beside ours (`rws_worker --workers 4`):

- SQLite: Huey 3.5.4, SqliteHuey, `huey_consumer -w 4 -k thread`;
- PostgreSQL: Oban for Python 0.7.0, `oban start --queues default:4` (asyncio, four at once);
  and the Django-based peers, each with Django's contenttypes app beside it as ours has:
  procrastinate 3.10.0 (`python -m django procrastinate worker --concurrency 4`) and django-ox
  1.9.1, a `django.tasks` backend (`python -m django ox_worker --concurrency 4`);
- tasks: the `django.tasks` drain on SQLite, ours an `@task` task through RwsJobsBackend, beside
  django-tasks-db 0.13.0 (`python -m django db_worker`, one task at a time: it has no
  concurrency setting) and django-ox 1.9.1, both on SQLite in WAL mode as ours is.

The peers run from .venv/peers (pyproject's `peers` dependency group), on the same machine and
database server. Also reported: each worker's peak resident memory (VmHWM) and the enqueue rate.
The ratio is ours beside the fastest peer of the database; the memory goal of issue 40 is ours
beside the lightest Django-based peer.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PEERS_PY = ROOT / ".venv" / "peers" / "bin"
STAMPS = Path("/tmp/rws-bench-stamps")
HUEY_DB = Path("/tmp/rws-bench-huey.sqlite3")
OBAN_DB = "rws_bench_oban"
OBAN_DSN = f"postgresql://postgres@127.0.0.1:5432/{OBAN_DB}"
DJANGO_PEERS_DB = "rws_bench_djpeers"
DJANGO_PEERS_SQLITE = Path("/tmp/rws-bench-djpeers.sqlite3")
TIMEOUT = 600.0
ENQUEUE = "from benchmarks.peerapps import {app}; {app}.enqueue({n})"


def read_stamps() -> list[float]:
    try:
        return [float(line) for line in STAMPS.read_text().split()]
    except FileNotFoundError:
        return []


def count_stamps() -> int:
    try:
        return STAMPS.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def run_worker(argv: list[str], env: dict[str, str], n: int) -> tuple[float, float]:
    """Start a worker, wait until it has started ``n`` jobs, stop it; (jobs/s, peak RSS MB)."""
    from benchmarks.run import peak_rss_mb

    log = tempfile.TemporaryFile("w+")  # not a pipe: a worker that logs much would block on it
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)
    rss = 0.0
    deadline = time.monotonic() + TIMEOUT
    try:
        while count_stamps() < n:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"{argv[0]} exited with {proc.returncode}: {log.read()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{argv} did not drain {n} jobs in {TIMEOUT} s")
            rss = max(rss, peak_rss_mb(proc.pid))
            time.sleep(0.02)
        rss = max(rss, peak_rss_mb(proc.pid))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    stamps = sorted(read_stamps())
    if len(stamps) != n:
        raise RuntimeError(f"{argv[0]}: {len(stamps)} jobs started, {n} enqueued")
    return (n - 1) / (stamps[-1] - stamps[0]), rss


def fresh_stamps() -> None:
    STAMPS.unlink(missing_ok=True)


def ours(db: str, n: int, tasks: bool = False) -> tuple[float, float, float]:
    """(drain jobs/s, worker RSS MB, enqueue jobs/s) of django-rws-jobs; with ``tasks``, of an
    @task task (benchmarks/benchapp/tasks.py) through our django.tasks backend."""
    from benchmarks.benchapp.tasks import stamp
    from benchmarks.run import clear, env_for
    from django_rws_jobs import enqueue

    clear()
    fresh_stamps()
    t0 = time.perf_counter()
    for _ in range(n):
        if tasks:
            stamp.enqueue()
        else:
            enqueue("bench.stamp")
    rate = n / (time.perf_counter() - t0)
    from django.db import connections

    connections.close_all()
    env = env_for(db, RWS_BENCH_STAMPS=str(STAMPS))
    # The worker runs from .venv/peers, as the peers do: one copy of the shared libraries (an RSS
    # counts the pages of a library's file that are mapped, more of a file the page cache holds).
    argv = [str(PEERS_PY / "python"), "-m", "django", "rws_worker", "--workers", "4"]
    drain, rss = run_worker(argv, env, n)
    return drain, rss, rate


def peer_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "RWS_BENCH_STAMPS": str(STAMPS), **extra}


def huey(n: int) -> tuple[float, float, float]:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{HUEY_DB}{suffix}").unlink(missing_ok=True)
    fresh_stamps()
    env = peer_env(RWS_BENCH_HUEY_DB=str(HUEY_DB))
    t0 = time.perf_counter()
    subprocess.run(
        [str(PEERS_PY / "python"), "-c", ENQUEUE.format(app="huey_app", n=n)],
        cwd=ROOT,
        env=env,
        check=True,
    )
    rate = n / (time.perf_counter() - t0)  # (includes the interpreter's start, a fraction of a second)
    argv = [
        str(PEERS_PY / "huey_consumer"),
        "benchmarks.peerapps.huey_app.huey",
        "-w",
        "4",
        "-k",
        "thread",
        "-q",
    ]
    drain, rss = run_worker(argv, env, n)
    return drain, rss, rate


def psql(sql: str, db: str = "postgres") -> None:
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", db, "-qc", sql], check=True)


def oban(n: int, installed: list[object]) -> tuple[float, float, float]:
    env = peer_env(RWS_BENCH_OBAN_DSN=OBAN_DSN)
    if not installed:
        psql(f"DROP DATABASE IF EXISTS {OBAN_DB} WITH (FORCE)")
        psql(f"CREATE DATABASE {OBAN_DB}")
        subprocess.run([str(PEERS_PY / "oban"), "install", "--dsn", OBAN_DSN], cwd=ROOT, env=env, check=True)
        installed.append(True)
    psql("TRUNCATE oban_jobs", OBAN_DB)
    fresh_stamps()
    t0 = time.perf_counter()
    subprocess.run(
        [str(PEERS_PY / "python"), "-c", ENQUEUE.format(app="oban_app", n=n)],
        cwd=ROOT,
        env=env,
        check=True,
    )
    rate = n / (time.perf_counter() - t0)
    argv = [
        str(PEERS_PY / "oban"),
        "start",
        "--dsn",
        OBAN_DSN,
        "--queues",
        "default:4",
        "--log-level",
        "warning",
    ]
    drain, rss = run_worker(argv, env, n)
    return drain, rss, rate


#: Per Django-based peer: its worker's arguments, and the code that empties its queue. ox_worker
#: logs each task at INFO unless -v 0; ours and the others log warnings only.
DJANGO_PEERS = {
    "procrastinate": (
        ["procrastinate", "worker", "--concurrency", "4"],
        "from procrastinate.contrib.django.models import ProcrastinateJob as M",
    ),
    "ox": (["ox_worker", "-v", "0", "--concurrency", "4"], "from django_ox.models import OxTask as M"),
    "tasks_db": (["db_worker"], "from django_tasks_db.models import DBTaskResult as M"),
}


def django_peer(peer: str, db: str, n: int, installed: list[object]) -> tuple[float, float, float]:
    """A Django-based peer (DJANGO_PEERS) on PostgreSQL or SQLite (``db``), with
    benchmarks/peerapps/django_settings.py."""
    name = DJANGO_PEERS_DB if db == "postgres" else str(DJANGO_PEERS_SQLITE)
    env = peer_env(
        DJANGO_SETTINGS_MODULE="benchmarks.peerapps.django_settings",
        RWS_BENCH_DJANGO_PEER=peer,
        RWS_BENCH_DJANGO_PEERS_DB=name,
    )
    python = str(PEERS_PY / "python")
    if not installed:
        if db == "postgres":
            psql(f"DROP DATABASE IF EXISTS {DJANGO_PEERS_DB} WITH (FORCE)")
            psql(f"CREATE DATABASE {DJANGO_PEERS_DB}")
        for suffix in ("", "-wal", "-shm"):
            Path(f"{DJANGO_PEERS_SQLITE}{suffix}").unlink(missing_ok=True)
        installed.append(True)
    if peer not in installed:
        subprocess.run([python, "-m", "django", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
        installed.append(peer)
    worker, model = DJANGO_PEERS[peer]
    subprocess.run(
        [python, "-c", f"import django; django.setup(); {model}; M.objects.all().delete()"],
        cwd=ROOT,
        env=env,
        check=True,
    )
    fresh_stamps()
    app = "procrastinate_app" if peer == "procrastinate" else "tasks_app"
    enqueue = (
        f"import django; django.setup(); from benchmarks.peerapps.{app}.tasks import enqueue; enqueue({n})"
    )
    t0 = time.perf_counter()
    subprocess.run([python, "-c", enqueue], cwd=ROOT, env=env, check=True)
    rate = n / (time.perf_counter() - t0)
    drain, rss = run_worker([python, "-m", "django", *worker], env, n)
    return drain, rss, rate


#: The peers per run: "tasks" is the django.tasks drain on SQLite (ours: an @task task).
PEERS = {"sqlite": ["huey"], "postgres": ["oban", "procrastinate", "ox"], "tasks": ["tasks_db", "ox"]}
NAMES = {
    "huey": "Huey 3.5.4",
    "oban": "Oban 0.7.0",
    "procrastinate": "procrastinate 3.10.0",
    "ox": "django-ox 1.9.1",
    "tasks_db": "django-tasks-db 0.13.0",
}
DJANGO_BASED = ("procrastinate", "ox", "tasks_db")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "dbs",
        nargs="*",
        metavar="sqlite|postgres|tasks",
        help="default: all three (tasks: django.tasks on SQLite)",
    )
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--peers", help="a comma-separated subset of: " + ", ".join(NAMES))
    args = parser.parse_args()
    args.dbs = args.dbs or list(PEERS)
    if unknown := [db for db in args.dbs if db not in PEERS]:
        parser.error(f"unknown database(s) {', '.join(unknown)}: use sqlite, postgres or tasks")
    wanted = args.peers.split(",") if args.peers else list(NAMES)
    if unknown := [p for p in wanted if p not in NAMES]:
        parser.error(f"unknown peer(s) {', '.join(unknown)}: use {', '.join(NAMES)}")
    if len(args.dbs) > 1:  # one Django set-up per process: a child per database
        for db in args.dbs:
            argv = [sys.executable, __file__, db, "--jobs", str(args.jobs), "--repeat", str(args.repeat)]
            subprocess.run([*argv, *(["--peers", args.peers] if args.peers else [])], check=True)
        return
    db = args.dbs[0]
    peers = [p for p in PEERS[db] if p in wanted]
    sys.path.insert(0, str(ROOT))
    from benchmarks.run import reset_database, setup_django

    django_db = "sqlite" if db == "tasks" else db
    setup_django(django_db)
    reset_database(django_db)
    results: dict[str, list[tuple[float, float, float]]] = {"ours": [], **{p: [] for p in peers}}
    installed: dict[str, list[object]] = {"oban": [], "django": []}
    for _ in range(args.repeat):  # alternating, so that all meet the same hours of the machine
        results["ours"].append(ours(django_db, args.jobs, tasks=db == "tasks"))
        for peer in peers:
            if peer == "huey":
                results[peer].append(huey(args.jobs))
            elif peer == "oban":
                results[peer].append(oban(args.jobs, installed["oban"]))
            else:
                results[peer].append(django_peer(peer, django_db, args.jobs, installed["django"]))
    med = {k: [statistics.median(r[i] for r in v) for i in range(3)] for k, v in results.items()}
    o = med["ours"]
    print(
        f"W1 on {'SQLite, django.tasks' if db == 'tasks' else db}, {args.jobs} jobs, "
        f"medians of {args.repeat} alternating rounds\n\n"
        "| system | drain (jobs/s) | ours / it | worker RSS MB | enqueue jobs/s | drain rounds |\n"
        "|---|---|---|---|---|---|"
    )
    for name, (drain, rss, rate) in med.items():
        rounds = " / ".join(f"{r[0]:,.0f}" for r in results[name])
        label = "django-rws-jobs" if name == "ours" else NAMES[name]
        print(f"| {label} | {drain:,.0f} | {o[0] / drain:.2f}x | {rss:.1f} | {rate:,.0f} | {rounds} |")
    if peers:
        best = max(peers, key=lambda p: med[p][0])
        print(f"\nDrain beside the fastest peer ({NAMES[best]}): {o[0] / med[best][0]:.2f}x", end="")
        if light := [p for p in peers if p in DJANGO_BASED]:
            lightest = min(light, key=lambda p: med[p][1])
            print(
                f"; worker RSS {o[1]:.1f} MB beside the lightest Django-based peer's "
                f"({NAMES[lightest]}) {med[lightest][1]:.1f} MB",
                end="",
            )
        print(flush=True)


if __name__ == "__main__":
    main()
