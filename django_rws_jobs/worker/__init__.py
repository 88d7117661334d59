"""The worker: executor threads fed by one dispatcher, a completer, a lease keeper, a scheduler.

One supervisor (:class:`Worker`, in ``supervisor.py``) starts small roles, each a class with its
own state and a ``loop()``, that share one :class:`~.shared.Shared`: the :class:`Dispatcher`
claims as many due jobs as there are idle executors; each :class:`Executor` runs them; the
:class:`Completer` records outcomes in batches; the :class:`LeaseKeeper` renews the leases of held
jobs and takes back expired ones; the :class:`Scheduler` enqueues due cron jobs; on PostgreSQL a
:class:`Listener` turns NOTIFY into a wake-up (polling still runs). In the thread pool a
:class:`Watchdog` enforces time limits; with ``--pool processes`` each executor is a
:class:`ProcessExecutor` whose handlers run in a child process (worker/pool.py, worker/child.py).
Signal handlers only set flags; every wait is on an Event, so a stop is instant. Each role's
connection is reopened after an error (``reconnect``). ``tick`` runs one due job in the calling
thread (``django_rws_jobs.tick``). The top part but for the entry points: it may import every part
below it (tests/test_imports.py). docs/design.md describes the roles.
"""

from typing import Any

from ..queue.ids import claim_token, worker_id
from .completer import Completer
from .dispatcher import Dispatcher
from .executor import Executor
from .keeper import LeaseKeeper
from .listener import Listener
from .scheduler import Scheduler
from .shared import Shared
from .supervisor import Worker
from .timeouts import Watchdog

__all__ = [
    "Completer",
    "Dispatcher",
    "Executor",
    "LeaseKeeper",
    "Listener",
    "ProcessExecutor",
    "Scheduler",
    "Shared",
    "Watchdog",
    "Worker",
    "claim_token",
    "worker_id",
]


def __getattr__(name: str) -> Any:
    # The process pool (worker/pool.py, and multiprocessing with it) loads only when it is used.
    if name == "ProcessExecutor":
        from .pool import ProcessExecutor  # (the process pool only: it loads multiprocessing)

        return ProcessExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
