"""In-process wake-ups: a job enqueued in a process that runs a worker wakes it at commit."""

from __future__ import annotations

import threading

#: Events of the workers running in this process; set when a job is committed here.
listeners: set[threading.Event] = set()


def notify() -> None:
    for event in list(listeners):
        event.set()
