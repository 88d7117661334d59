"""Handlers used by the tests; they leave their traces in the database so other processes see them."""

import json
import os
import time
from pathlib import Path

from django_rws_jobs import current_job, job
from django_rws_jobs.signals import job_dead


def _trace(kind: str, payload: str) -> None:
    from .models import Run

    Run.objects.create(kind=kind, payload=payload, pid=os.getpid())


@job("test.record")
def record(payload: str) -> None:
    _trace("record", payload)


@job("test.fail")
def fail(payload: str) -> None:
    raise ValueError(f"boom {payload}")


@job("test.sleep")
def sleep(payload: str) -> None:
    _trace("start", payload)
    time.sleep(float(payload))
    _trace("end", payload)


@job("test.span")
def span(payload: str) -> None:
    """Payload "<label> <seconds>": a start trace, a sleep, an end trace, each under the label."""
    label, seconds = payload.split()
    _trace("start", label)
    time.sleep(float(seconds))
    _trace("end", label)


@job("test.start_then_sleep")
def start_then_sleep(payload: str) -> None:
    """Leaves its start trace, then touches no database: a partition does not hang its end. The
    trace's payload is ``<payload>:<local port of the connection that wrote it>``, so a test can
    wait for that connection to be closed (tests/test_dead_connections.py): seeing the row
    committed does not mean the server's answer reached the handler."""
    from django.db import connection

    connection.ensure_connection()
    _trace("start", f"{payload}:{_local_port(connection)}")
    connection.close()
    time.sleep(float(payload))


def _local_port(connection) -> int:
    """The local TCP port of a Django connection's socket (0 on SQLite)."""
    import socket

    from django_rws_jobs.database.deadline import socket_of

    fd = socket_of(connection.connection)
    if fd is None:
        return 0
    with socket.socket(fileno=os.dup(fd)) as s:
        return s.getsockname()[1]


@job("test.exit")
def hard_exit(payload: str) -> None:
    _trace("exit", payload)
    os._exit(7)


@job("test.noop")
def noop(payload: str) -> None:
    pass


@job("test.mailer", queue="mailers", priority=5, max_retries=1)
def mailer(payload: str) -> None:
    _trace("mailer", payload)


@job("test.in_transaction")
def in_transaction(payload: str) -> None:
    from django.db import connection

    _trace("atomic" if connection.in_atomic_block else "autocommit", payload)


@job("test.system_exit")
def system_exit(payload: str) -> None:
    _trace("system_exit", payload)
    raise SystemExit(3)


@job("test.slow_record")
def slow_record(payload: str) -> None:
    time.sleep(0.02)
    _trace("record", payload)


@job("test.chain")
def chain(payload: str) -> None:
    from django_rws_jobs import enqueue

    _trace("chain", payload)
    enqueue("test.record", f"after-{payload}")


_opened = 0


def _count_connection(sender, connection, **kwargs) -> None:
    global _opened
    _opened += 1


@job("test.connection")
def which_connection(payload: str) -> None:
    """Records how many connections this process had opened once this job's is open."""
    from django.db import connection
    from django.db.backends.signals import connection_created

    connection_created.connect(_count_connection, dispatch_uid="tests.count_connection")
    connection.ensure_connection()
    _trace("connection", f"{payload}:{_opened}")


@job("test.async_record")
async def async_record(payload: str) -> None:
    import asyncio

    from asgiref.sync import sync_to_async

    await asyncio.sleep(0)
    await sync_to_async(_trace)("async", payload)


@job("test.async_sleep")
async def async_sleep(payload: str) -> None:
    """Awaits asyncio.sleep(600) once it traced its start; traces ``stopped`` when
    asyncio.CancelledError reaches it there."""
    import asyncio

    from asgiref.sync import sync_to_async

    await sync_to_async(_trace)("async-start", payload)
    try:
        await asyncio.sleep(600)
    except asyncio.CancelledError:
        await sync_to_async(_trace)("stopped", payload)
        raise


@job("test.generator")
def generator(payload: str):
    _trace("generator", payload)
    yield


@job("test.returns_coroutine")
def returns_coroutine(payload: str):
    return async_record(payload)


#: Error messages no database stores as they are: a file name that is not UTF-8 (a lone
#: surrogate, as os.fsdecode gives it), a NUL (PostgreSQL's text cannot hold one), a megabyte.
UNSTORABLE = {"surrogate": os.fsdecode(b"\xff.txt"), "nul": "a\x00b", "huge": "x" * 1_000_000}


@job("test.unstorable_error")
def unstorable_error(payload: str) -> None:
    raise FileNotFoundError(f"cannot open {UNSTORABLE[payload]}")


def _on_dead_exit(sender, job, **kwargs) -> None:
    if job.payload == "exit-in-receiver":
        _trace("receiver1", job.id)
        raise SystemExit(4)


def _on_dead_record(sender, job, **kwargs) -> None:
    if job.payload == "exit-in-receiver":
        _trace("receiver2", job.id)


# In this order: the first receiver raises SystemExit, the second must still be called.
job_dead.connect(_on_dead_exit, dispatch_uid="tests.on_dead_exit")
job_dead.connect(_on_dead_record, dispatch_uid="tests.on_dead_record")


def _forever(step: float) -> None:
    while True:
        time.sleep(step)


@job("test.spin")
def spin(payload: str) -> None:
    """Runs for ever in small steps: Python can interrupt it between two."""
    _trace("spin", payload)
    _forever(0.02)


@job("test.catch_timeout")
def catch_timeout(payload: str) -> None:
    """Swallows what interrupts it and returns: the job still timed out."""
    from django_rws_jobs import JobTimeout

    _trace("spin", payload)
    try:
        _forever(0.02)
    except JobTimeout:
        _trace("caught", payload)


@job("test.spin_limited", timeout=0.5)
def spin_limited(payload: str) -> None:
    spin(payload)


@job("test.unlimited", timeout=None)
def unlimited(payload: str) -> None:
    time.sleep(float(payload))
    _trace("unlimited", payload)


@job("test.block")
def block(payload: str) -> None:
    """Blocks in one C call that never returns: select() on a socket that never answers."""
    import select
    import socket

    _trace("block", payload)
    a, b = socket.socketpair()
    select.select([a], [], [])


@job("test.block_ignoring_sigterm")
def block_ignoring_sigterm(payload: str) -> None:
    """Blocks for ever and ignores SIGTERM: only SIGKILL ends it."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _trace("block", payload)
    _forever(3600)


@job("test.pid")
def pid(payload: str) -> None:
    _trace("pid", payload)


_leaked: list[bytes] = []


@job("test.leak")
def leak(payload: str) -> None:
    """Keeps ``payload`` MB for the rest of the process's life."""
    _leaked.append(b"\x01" * (int(payload) * 1024 * 1024))  # written, so resident
    _trace("leak", payload)


@job("test.busy")
def busy(payload: str) -> None:
    """Busy for ``payload`` seconds in pure Python: interruptible at any bytecode."""
    end = time.monotonic() + float(payload)
    while time.monotonic() < end:
        pass


@job("test.blocked_then_exit")
def blocked_then_exit(payload: str) -> None:
    """Blocks in one C call for ``payload`` seconds, then turns what interrupted it into
    SystemExit (a handler of an abandoned thread that ends it its own way)."""
    try:
        time.sleep(float(payload))
    except BaseException:
        raise SystemExit(3) from None


@job("test.keyed")
def keyed(payload: str) -> None:
    """test.span with a concurrency key's limit of 1 (the default)."""
    span(payload)


@job("test.keyed2", concurrency_limit=2)
def keyed2(payload: str) -> None:
    span(payload)


@job("test.keyed3", concurrency_limit=3)
def keyed3(payload: str) -> None:
    span(payload)


def _whoami(payload: str) -> str:
    ctx = current_job()
    return json.dumps(
        {"label": payload, "id": ctx.id, "job_type": ctx.job_type, "queue": ctx.queue, "attempt": ctx.attempt}
    )


@job("test.whoami")
def whoami(payload: str) -> None:
    """Records what current_job() says; "fail-first" fails its first attempt."""
    _trace("whoami", _whoami(payload))
    if payload == "fail-first" and current_job().attempt == 1:
        raise ValueError("the first attempt fails")


@job("test.whoami_async")
async def whoami_async(payload: str) -> None:
    from .models import Run

    await Run.objects.acreate(kind="whoami", payload=_whoami(payload), pid=os.getpid())


@job("test.batch_callback")
def batch_callback(payload: str) -> None:
    """Records the batch and event it was called for, with the batch's counts as it reads them."""
    ctx = current_job()
    b = ctx.batch
    _trace(
        "callback",
        json.dumps(
            {
                "payload": payload,
                "job": ctx.id,
                "batch": ctx.batch_id,
                "event": ctx.batch_event,
                "state": b.state,
                "counts": [b.total, b.succeeded, b.failed, b.cancelled, b.pending],
            }
        ),
    )


@job("test.batch_member")
def batch_member(payload: str) -> None:
    """Records the batch it belongs to; fails when its payload says "fail"."""
    _trace("member", json.dumps({"payload": payload, "batch": current_job().batch_id}))
    if payload == "fail":
        raise ValueError("member failed")


@job("test.batch_output")
def batch_output(payload: str) -> None:
    """Keeps an output with current_job().record(); its payload (JSON) says what: "value" (with
    the attempt appended when "per_attempt"), "fail_first" (fails its first attempt after
    recording), "twice" (records a first value, then the real one), "rollback" (records inside a
    transaction that rolls back), "steal" (its claim is taken before it records). Traces what
    record() returned."""
    from django.db import transaction

    ask = json.loads(payload)
    ctx = current_job()
    value = ask.get("value")
    if ask.get("per_attempt"):
        value = f"{value}@{ctx.attempt}"
    if ask.get("twice"):
        ctx.record("first")
    if ask.get("steal"):
        from django_rws_jobs.models import Job

        Job.objects.filter(id=ctx.id).update(locked_by="another-claim")
    if ask.get("rollback"):
        try:
            with transaction.atomic():
                ctx.record(value)
                raise RuntimeError("roll back")
        except RuntimeError:
            pass
        kept = None
    else:
        kept = ctx.record(value)
    _trace("output", json.dumps({"job": ctx.id, "kept": kept}))
    if ask.get("fail_first") and ctx.attempt == 1:
        raise ValueError("first attempt fails")


@job("test.batch_async")
async def batch_async(payload: str) -> None:
    """An async def handler that uses every JobContext member on its event loop (and the async
    twins), then traces what each gave, or the error it raised: "batch", "event", "state" and
    "total" (ctx.batch), "metadata", "kept" (record()), "akept" (arecord()), "saved"
    (asave_metadata()). Fails when its payload ends with "fail"."""
    from asgiref.sync import sync_to_async

    ctx = current_job()
    seen: dict = {"payload": payload}

    def use(name, get):
        try:
            seen[name] = get()
        except Exception as exc:  # traced: the test says which may raise
            seen[name] = f"{type(exc).__name__}: {exc}"

    ctx.progress(1, 2, "half")
    use("batch", lambda: ctx.batch_id)
    use("event", lambda: ctx.batch_event)
    use("state", lambda: ctx.batch.state)
    use("metadata", lambda: dict(ctx.metadata))
    use("kept", lambda: ctx.record("sync"))
    seen["akept"] = await ctx.arecord({"from": payload})
    ctx.metadata["async"] = True
    seen["saved"] = await ctx.asave_metadata()
    await sync_to_async(_trace)("batch-async", json.dumps(seen))
    if payload.endswith("fail"):
        raise ValueError("asked to fail")


@job("test.enqueue_after_me")
def enqueue_after_me(payload: str) -> None:
    """Enqueues a test.record job that waits for this one, while this one runs."""
    from django_rws_jobs import enqueue

    enqueue("test.record", payload, after=[current_job().id])


def _wait_for_file(path: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)


@job("test.report", max_retries=0)
def report(payload: str) -> None:
    """Reports progress, then changes and saves metadata, as the JSON payload says:
    {"steps": n, "total": n, "atomic": bool, "write": bool, "flags": [path, path], "set": {...},
    "after": {...}, "fail": bool}. With "atomic", all of it inside one transaction (which writes
    a Run first if "write"); each flag file is waited for, after the progress and after the save."""
    from contextlib import nullcontext

    from django.db import transaction

    from .models import Run

    spec = json.loads(payload)
    ctx = current_job()
    flags = spec.get("flags") or [None, None]
    with transaction.atomic() if spec.get("atomic") else nullcontext():
        if spec.get("write"):
            Run.objects.create(kind="report-inside", payload=ctx.id, pid=os.getpid())
        elif spec.get("atomic"):
            Run.objects.count()  # a read: SQLite's transaction then holds a snapshot, not the write lock
        steps = spec.get("steps", 0)
        for i in range(steps):
            ctx.progress(i + 1, spec.get("total", steps), f"step {i + 1}")
        if flags[0]:
            _wait_for_file(flags[0])
        if spec.get("set"):
            ctx.metadata.update(spec["set"])
            _trace("saved", json.dumps(ctx.save_metadata()))
        if flags[1]:
            _wait_for_file(flags[1])
        ctx.metadata.update(spec.get("after", {}))
        if spec.get("fail"):
            raise ValueError("asked to fail")


def _report_then_change() -> None:
    """Reports steps 1 to 3 of 4 and changes the metadata, saving nothing: the writer's rounds
    are held off, so only the attempt's end writes them (context.JobContext._end)."""
    from django_rws_jobs.running import reports

    ctx = current_job()
    reports.writer(ctx._alias).last_write = time.monotonic() + 3600
    for i in range(3):
        ctx.progress(i + 1, 4, f"step {i + 1}")
    ctx.metadata["stage"] = "stalled"


@job("test.report_stall", max_retries=0)
def report_stall(payload: str) -> None:
    """Reports and changes its metadata unsaved (_report_then_change), traces "stalling", then
    runs for ever in small steps, until a time limit or a cancel stops it."""
    _report_then_change()
    _trace("stalling", payload)
    _forever(0.02)


@job("test.report_stall_async", max_retries=0)
async def report_stall_async(payload: str) -> None:
    """report_stall as an async def handler: it waits in asyncio.sleep(600)."""
    import asyncio

    from asgiref.sync import sync_to_async

    _report_then_change()  # its metadata read runs off the event loop (context._off_the_loop)
    await sync_to_async(_trace)("stalling", payload)
    await asyncio.sleep(600)


@job("test.report_loop", max_retries=0)
def report_loop(payload: str) -> None:
    """Calls progress() as fast as it can for ``payload`` seconds; traces how many times."""
    ctx = current_job()
    end = time.monotonic() + float(payload)
    n = 0
    while time.monotonic() < end:
        n += 1
        ctx.progress(n)
    _trace("loop", str(n))


@job("test.report_lost", max_retries=0)
def report_lost(payload: str) -> None:
    """Loses its claim (another claim takes the row), then reports and saves: traces what
    save_metadata() answered."""
    from django_rws_jobs.models import Job

    ctx = current_job()
    Job.objects.filter(id=ctx.id).update(locked_by="another-worker:1:x#1")
    ctx.progress(1, 2, "lost")
    ctx.metadata["lost"] = True
    _trace("saved", json.dumps(ctx.save_metadata()))


@job("test.metadata")
def metadata(payload: str) -> None:
    """Traces the metadata its handler sees."""
    _trace("metadata", json.dumps([payload, current_job().metadata]))


@job("test.report_async", max_retries=0)
async def report_async(payload: str) -> None:
    """An async handler that reports, changes and saves its metadata, then fails."""
    ctx = current_job()
    ctx.progress(1, 2, "half")
    ctx.metadata["async"] = True
    _trace_saved = await ctx.asave_metadata()
    from .models import Run

    await Run.objects.acreate(kind="saved", payload=json.dumps(_trace_saved), pid=os.getpid())
    raise ValueError("asked to fail")


def _decision(payload: str) -> None:
    """Raise what ``payload`` names (tests/test_outcomes.py): "snooze 30", "retry 120 reason",
    "retry", "fail reason", "cancel reason", "catch" (a Snooze caught: the handler returns),
    "error" (a plain ValueError), "lookup" (a KeyError)."""
    from django_rws_jobs import Cancel, Fail, Retry, Snooze

    word, _, rest = payload.partition(" ")
    if word == "snooze":
        raise Snooze(float(rest))
    if word == "retry":
        delay, _, reason = rest.partition(" ")
        raise Retry(float(delay) if delay else None, reason=reason)
    if word == "fail":
        raise Fail(rest)
    if word == "cancel":
        raise Cancel(rest)
    if word == "catch":
        try:
            raise Snooze(10)
        except Snooze:
            return
    if word == "lookup":
        raise KeyError(rest)
    raise ValueError(f"plain {rest}")


@job("test.decide")
def decide(payload: str) -> None:
    _trace("decide", payload)
    _decision(payload)


@job("test.async_decide")
async def async_decide(payload: str) -> None:
    from asgiref.sync import sync_to_async

    await sync_to_async(_trace)("async_decide", payload)
    _decision(payload)


@job("test.fail_on", fail_on=(LookupError,))
def fails_on_lookup(payload: str) -> None:
    _decision(payload)


@job(
    "test.typed_backoff",
    backoff=lambda attempt, error: 100 * attempt + (7 if isinstance(error, KeyError) else 0),
)
def typed_backoff(payload: str) -> None:
    _decision(payload)


@job("test.dict_backoff", backoff={"initial": 50, "multiplier": 3, "jitter": 0})
def dict_backoff(payload: str) -> None:
    _decision(payload)


@job("test.raising_backoff", backoff=lambda attempt, error: 1 / 0)
def raising_backoff(payload: str) -> None:
    _decision(payload)


@job("test.garbage_backoff", backoff=lambda attempt, error: "soon")
def garbage_backoff(payload: str) -> None:
    _decision(payload)


# -- long jobs (tests/test_long_jobs.py) ---------------------------------------------------------


def _long_args(payload: str) -> dict:
    return json.loads(payload)


def _item_body(args: dict, key: int) -> None:
    """An item's work: its trace, then a failure or a pause as the payload asks; a file named by
    ``started`` tells the test that items are being worked on."""
    ctx = current_job()
    _trace("item", f"{args['label']}:{key}")
    if args.get("started"):
        Path(args["started"]).touch()
    if key == args.get("fail_at") and ctx.attempt == 1:
        raise ValueError(f"item {key} failed")
    time.sleep(args.get("sleep", 0))


@job("test.long_rows", max_retries=3)
def long_rows(payload: str) -> None:
    """Payload JSON: label, group, sleep, fail_at, started: each Item of the group, by pk."""
    from .models import Item

    args = _long_args(payload)
    for item in current_job().iterate(Item.objects.filter(group=args["group"]).order_by("pk")):
        _item_body(args, item.pk)
    _trace("long_done", args["label"])


@job("test.long_rows_dead", max_retries=0)
def long_rows_dead(payload: str) -> None:
    long_rows(payload)


@job("test.long_produced", max_retries=3)
def long_produced(payload: str) -> None:
    """Payload JSON: label, count, sleep, fail_at, started: numbers 0..count-1 from a function."""
    args = _long_args(payload)

    def numbers(cursor):
        for n in range(0 if cursor is None else cursor, args["count"]):
            yield n + 1, n

    for n in current_job().iterate(numbers):
        _item_body(args, n)
    _trace("long_done", args["label"])


@job("test.own_loop", max_retries=3)
def own_loop(payload: str) -> None:
    """Payload JSON: label, chunks, sleep, started: a loop of its own, each chunk a step; at the
    worker's stop it raises JobInterrupted."""
    from django_rws_jobs import JobInterrupted

    args = _long_args(payload)
    ctx = current_job()
    for n in range(args["chunks"]):
        if ctx.stopping:
            raise JobInterrupted("stopping between chunks")
        ctx.step(f"chunk-{n}", _item_body, args, n)
    _trace("long_done", args["label"])


@job("test.steps", max_retries=3)
def steps(payload: str) -> None:
    """Charge, then a receipt that fails on the first attempt: the charge runs once."""
    ctx = current_job()
    charged = ctx.step("charge", lambda: _trace("charge", payload) or {"charged": payload})
    if ctx.attempt == 1:
        raise ValueError("the receipt could not be sent")
    ctx.step("receipt", _trace, "receipt", charged["charged"])


@job("test.atomic_step", max_retries=3)
def atomic_step(payload: str) -> None:
    """Payload JSON: name, marker, when ("before_commit" or "after_commit"): an atomic step writes
    an Effect; on the first attempt the handler touches ``marker`` and sleeps there, for the test
    to kill the worker between the step's write and its commit, or after its commit."""
    from .models import Effect

    args = _long_args(payload)
    ctx = current_job()

    def effect():
        Effect.objects.create(name=args["name"])
        if ctx.attempt == 1 and args["when"] == "before_commit":
            Path(args["marker"]).touch()
            time.sleep(600)
        return args["name"]

    ctx.step("effect", effect, atomic=True)
    if ctx.attempt == 1 and args["when"] == "after_commit":
        Path(args["marker"]).touch()
        time.sleep(600)
    _trace("long_done", args["name"])


def _bad_use(case: str) -> None:
    from .models import Item

    ctx = current_job()
    items = Item.objects.all()
    if case == "step_not_json":
        ctx.step("s", lambda: object())
    elif case == "step_too_big":
        ctx.step("s", lambda: "x" * 70_000)
    elif case == "unordered":
        list(ctx.iterate(items.order_by("-pk")))
    elif case == "not_unique":
        list(ctx.iterate(items.order_by("number"), by="number"))
    elif case == "sliced":
        list(ctx.iterate(items.order_by("pk")[:5]))
    elif case == "cursor_not_json":
        list(ctx.iterate(lambda cursor: iter([(object(), 1)])))
    elif case == "two_steps":
        ctx.step("s", lambda: 1)
        ctx.step("s", lambda: 2)
    elif case == "two_loops":
        list(ctx.iterate(items.order_by("pk"), name="rows"))
        list(ctx.iterate(items.order_by("pk"), name="rows"))
    elif case == "not_iterable":
        ctx.iterate(42)


@job("test.long_bad", max_retries=0)
def long_bad(payload: str) -> None:
    """Payload: a misuse of iterate or step (tests/test_long_jobs.py)."""
    _bad_use(payload)


@job("test.payload_stable")
def payload_stable(payload: str) -> None:
    """Traces its payload as it starts ("started"), then as its row holds it after a pause: a
    replace that changed a running job would show two different payloads, two jobs of a key that
    ran at once two starts in a row (tests/test_enqueue_once.py)."""
    from django.db import connection

    ctx = current_job()
    _trace("started", payload)
    time.sleep(0.05)
    with connection.cursor() as c:
        c.execute("SELECT payload FROM rws_jobs WHERE id = %s", [ctx.id])
        row = c.fetchone()
    _trace("stable" if row is not None and row[0] == payload else "mutated", payload)
