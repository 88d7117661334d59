"""Job ids (UUIDv7 strings, unique across processes and sorted by creation time), the worker id
and claim tokens."""

from __future__ import annotations

import itertools
import os
import re
import socket
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def new_id() -> str:
    """Return a 36-character UUIDv7 whose text order is creation order within this process.

    48 bits of unix milliseconds, a 12-bit counter that keeps ids made in the same millisecond in
    order (RFC 9562 method 1), and 62 random bits that keep processes and machines apart.
    """
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms = ms
            _counter = int.from_bytes(os.urandom(2), "big") & 0x3FF  # leave room to count up
        else:
            _counter += 1
            if _counter > 0xFFF:  # more than 4096 ids in one millisecond: borrow the next one
                _last_ms += 1
                _counter = 0
        ms, counter = _last_ms, _counter
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms << 80) | (0x7 << 76) | (counter << 64) | (0b10 << 62) | rand
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


#: The text ``new_id`` writes: a lowercase UUIDv7 (version 7, RFC 9562 variant).
_FORM = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def made_at(value: str) -> float | None:
    """The unix time (seconds) at which ``new_id`` made ``value``; None for a string of any other
    form, which this queue did not make."""
    if not _FORM.fullmatch(value):
        return None
    return int(value[:8] + value[9:13], 16) / 1000


def _new_worker_id() -> None:
    global _worker_id
    _worker_id = f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


_worker_id = ""
_new_worker_id()
# A forked child must not share its parent's claim tokens: it takes a worker id of its own at the
# fork, not at each claim, which stays cheap
# (tests/test_worker.py::test_a_forked_process_gets_a_worker_id_of_its_own).
os.register_at_fork(after_in_child=_new_worker_id)
_claims = itertools.count(1)
_claims_lock = threading.Lock()


def worker_id() -> str:
    """This process's name in claim tokens: host, pid and a random part."""
    return _worker_id


def claim_token() -> str:
    """A token unique to one claim: it fences every write that finishes the claimed jobs."""
    with _claims_lock:
        n = next(_claims)
    return f"{_worker_id}#{n}"
