"""A child process that runs handlers for one executor thread of ``rws_worker --pool processes``.

Children are forked by multiprocessing's fork server, a process started once per worker with Django
set up (``django_rws_jobs/preload.py``) and no threads or connections of its own: a child starts in
milliseconds with the handlers imported, and shares no socket, lock or database connection with
the worker's threads (a fork of the worker itself would copy connections that other threads use).
The parent sends one job at a time over a pipe; the child answers with its outcome (Answer).
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import multiprocessing
import operator
import os
import pickle
import resource
import select
import signal
import sys
import threading
import time
import traceback
import types
from multiprocessing.connection import Connection
from typing import Any

from ..attempts.outcomes import describe
from ..attempts.run import Watch, execute, watch
from ..queue.store import Claimed
from ..running.checkpoints import StopFlag, stop_requested
from ..running.context import serving

#: A job's fields in order, to send it as a tuple (a tuple of plain values pickles faster than
#: the dataclass).
astuple = operator.attrgetter(*(f.name for f in dataclasses.fields(Claimed)))


def send(conn: Connection, value: Any) -> None:
    """Send ``value`` pickled by the C pickler: Connection.send builds a ForkingPickler (a Python
    class, for sockets and other handles, which jobs and answers never hold) at every call. What
    the plain pickler refuses is pickled again by TaskPickler."""
    try:
        data = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    except pickle.PicklingError:
        buffer = io.BytesIO()
        TaskPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(value)
        data = buffer.getvalue()
    conn.send_bytes(data)


class TaskPickler(pickle.Pickler):
    """Pickles a django.tasks task's function by the name of its Task. A task's outcome holds its
    TaskResult, whose task holds the function; pickle names a function by its module and
    qualified name, which name the Task that wraps it, so the plain pickler refuses it and the
    child could answer no task's outcome
    (tests/test_pool_task_outcomes.py::test_a_task_in_a_child_process_ends_as_it_returned)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, types.FunctionType):
            module, name = obj.__module__, obj.__qualname__
            named = getattr(sys.modules.get(module), name, None)
            if named is not obj and getattr(named, "func", None) is obj:
                return task_function, (module, name)
        return NotImplemented


def task_function(module: str, name: str) -> Any:
    """The function of the task named ``name`` in ``module`` (TaskPickler)."""
    return getattr(importlib.import_module(module), name).func


def receive(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


#: What a child answers for a job: (error, traceback, its peak resident memory in MB, whether it
#: exits now: a handler raised SystemExit or the like, and a job sent to it would be lost).
Answer = tuple["str | None", "str | None", float, bool]


class ChildDied(Exception):
    """The child exited (or was killed) while it ran a job."""


def _context() -> Any:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["django_rws_jobs.queue.preload"])
    return ctx


class Child:
    """The parent's side of one child process."""

    def __init__(self, alias: str) -> None:
        ctx = _context()
        self.conn, theirs = ctx.Pipe()
        self.process = ctx.Process(
            target=serve, args=(theirs, alias, os.getpid()), name="rws-child", daemon=True
        )
        self.process.start()
        theirs.close()
        self.jobs = 0  # jobs this child has run
        self.peak_mb = 0.0

    @property
    def pid(self) -> int:
        return self.process.pid or 0

    def send(self, job: Claimed) -> None:
        send(self.conn, astuple(job))

    def answer(self, seconds: float | None) -> Answer | None:
        """The child's answer for the job sent; None when ``seconds`` passed first. Raises
        ChildDied when the child is gone."""
        try:
            if seconds is not None and not self.conn.poll(seconds):
                return None
            answer: Answer = receive(self.conn)
        except (EOFError, OSError):
            raise ChildDied(self.why_dead()) from None
        self.jobs += 1
        self.peak_mb = answer[2]
        return answer

    def why_dead(self) -> str:
        self.process.join(2)
        code = self.process.exitcode
        if code is None:
            return "it closed its pipe"
        if code < 0:
            return f"killed by signal {signal.Signals(-code).name}"
        return f"it exited with code {code}"

    def stop(self) -> None:
        """Let the child finish (it is idle) and exit."""
        try:
            send(self.conn, None)
        except OSError:
            pass
        self.process.join(5)
        if self.process.is_alive():
            self.kill(0)
        self.conn.close()

    def kill(self, grace: float, *, close: bool = True) -> None:
        """SIGTERM (which raises SystemExit in the child, so its ``finally`` blocks run), then
        SIGKILL if it is still there ``grace`` seconds later. ``close=False`` leaves the pipe to
        the executor that reads it (a cancel: worker/pool.py)."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            if not self.process.is_alive():
                break
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                break
            self.process.join(wait)
        if close:
            self.conn.close()


class _Running:
    """The job this child runs, as its SIGTERM handler sees it."""

    def __init__(self) -> None:
        self.handlers = Watch()  # whether the job's handler has returned (run.Watch)
        self.busy = False  # from a job's receipt to its answer's sending
        self.terminate: int | None = None  # a SIGTERM that came once the handler had returned


_running = _Running()
#: Set by SIGUSR1: the worker is stopping (current_job().stopping; iterate hands its job back).
_stopping = StopFlag()


def _ask_to_stop(signum: int, frame: Any) -> None:
    _stopping.set()


def _terminate(signum: int, frame: Any) -> None:
    """SystemExit in the handler (a cancel, a time limit, the worker's stop). Once the handler
    has returned, the child sends the job's outcome first, then exits: a job that finished is
    recorded as it ended
    (tests/test_cancel.py::test_a_cancel_that_reaches_a_handler_after_it_returned_leaves_it_done)."""
    if _running.busy and _running.handlers.outcome is not None:
        _running.terminate = signum
        return
    raise SystemExit(128 + signum)


def serve(conn: Connection, alias: str, worker_pid: int) -> None:
    """The child: run the jobs the parent sends until it sends None or goes away; ``alias`` is
    the queue's database (current_job() reads and writes it); ``worker_pid``, the worker's."""
    os.setpgrp()  # a Ctrl-C or a group-wide signal reaches the worker only, which decides
    _die_with_the_worker(worker_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGUSR1, _ask_to_stop)
    from django.db import connections  # (Django is set up: the fork server imported preload.py)

    serving.set(alias)
    stop_requested.set(_stopping)
    watch(_running.handlers)
    code = 0
    try:
        while (fields := receive(conn)) is not None:
            job = Claimed(*fields)
            _running.handlers.start(job)
            _running.busy = True
            try:
                error, tb = execute(job)
            except BaseException as exc:  # SystemExit and the like: a failure; then this child ends
                send(conn, (describe(exc), traceback.format_exc(), _peak_mb(), True))
                raise
            send(conn, (error, tb, _peak_mb(), False))
            _running.busy = False
            if _running.terminate is not None:
                raise SystemExit(128 + _running.terminate)
    except EOFError:
        pass  # the worker is gone
    except BaseException:
        code = 1
    finally:
        connections.close_all()
        os._exit(code)


def _die_with_the_worker(worker_pid: int) -> None:
    """End this child at once (as a ``kill -9`` would) when the worker that started it is gone,
    a ``kill -9`` of the worker included: an orphaned child would run its job on while another
    worker takes the job over and resumes it
    (tests/test_long_jobs.py::test_kill_9_mid_loop_resumes_from_a_recent_cursor). A thread waits
    on the worker's pidfd (Linux), or looks every second where there is none."""

    def wait() -> None:
        try:
            fd = os.pidfd_open(worker_pid)
        except ProcessLookupError:
            os._exit(1)
        except (AttributeError, OSError):
            while True:
                time.sleep(1.0)
                try:
                    os.kill(worker_pid, 0)
                except ProcessLookupError:
                    os._exit(1)
                except PermissionError:
                    pass
        select.select([fd], [], [])
        os._exit(1)

    threading.Thread(target=wait, name="rws-child-orphan-watch", daemon=True).start()


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux
